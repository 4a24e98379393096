"""The image build itself refuses a tampered sdist, a tampered wheel and a patch that does not apply.

Each case builds docker/Dockerfile.sm80 up to the stage that must refuse, from a scratch copy of the
build context with one input broken, and expects the build to fail with the one-line message that
names the input. Needs a Docker daemon and the smoke base image (`make image-smoke` makes both), and
minutes per case, so it runs only with DEEPINFER_DOCKER_TESTS=1 (docker/README.md records a run).
"""

import os
import subprocess
from pathlib import Path

import pytest
from pins import load_pins

ROOT = Path(__file__).resolve().parent.parent
DOCKER = os.environ.get("DOCKER", "/usr/bin/docker")
BASE = os.environ.get("SMOKE_BASE_IMAGE", "deepinfer-local/debian:trixie")

pytestmark = pytest.mark.skipif(
    os.environ.get("DEEPINFER_DOCKER_TESTS") != "1",
    reason="set DEEPINFER_DOCKER_TESTS=1 (needs dockerd, minutes)",
)


@pytest.fixture(scope="module")
def daemon():
    if subprocess.run([DOCKER, "image", "inspect", BASE], capture_output=True).returncode != 0:
        pytest.fail(f"{BASE} missing or no Docker daemon: run make image-smoke first")


def _context(tmp_path: Path) -> Path:
    """The snapshot `make image` builds from (scripts/docker_context.sh), to be broken by the test."""
    ctx = tmp_path / "ctx"
    subprocess.run(["bash", "scripts/docker_context.sh", str(ctx)], cwd=ROOT, check=True, capture_output=True)
    return ctx


def _build(ctx: Path, target: str) -> subprocess.CompletedProcess:
    pins = load_pins()
    args = {
        "BASE_IMAGE": BASE,
        "PYTHON_VERSION": "3.13",
        "CUDA_VERSION": pins["CUDA_VERSION"],
        "VLLM_BUILD": "precompiled",
        "VLLM_VERSION": pins["VLLM_VERSION"],
        "VLLM_SDIST_SHA256": pins["VLLM_SDIST_SHA256"],
        "VLLM_WHEEL_SHA256": pins["VLLM_WHEEL_SHA256"],
        "PATCHES_SHA256": subprocess.run(
            ["bash", "docker/patchset_hash.sh", "patches"], cwd=ctx, capture_output=True, text=True
        ).stdout.strip(),
        "GIT_SHA": "0" * 40,
    }
    cmd = [DOCKER, "build", "--network", "host", "--progress=plain", "-f", "docker/Dockerfile.sm80"]
    cmd += [w for k, v in args.items() for w in ("--build-arg", f"{k}={v}")]
    if Path("/etc/ssl/certs/ca-certificates.crt").exists():
        cmd += ["--secret", "id=pip_ca,src=/etc/ssl/certs/ca-certificates.crt"]
    cmd += ["--target", target, "."]
    return subprocess.run(
        cmd, cwd=ctx, capture_output=True, text=True, env={**os.environ, "DOCKER_BUILDKIT": "1"}
    )


def test_tampered_sdist_is_refused(daemon, tmp_path):
    ctx = _context(tmp_path)
    pins_file = ctx / "docker" / "versions.env"
    good = load_pins()["VLLM_SDIST_SHA256"]
    pins_file.write_text(pins_file.read_text().replace(good, "0" * 64))  # the download no longer matches
    proc = _build(ctx, "vllm-src")
    assert proc.returncode != 0
    assert (
        f"vllm-{load_pins()['VLLM_VERSION']}.tar.gz: sha256 {good} does not match the pinned {'0' * 64}"
        in (proc.stdout + proc.stderr)
    )


def test_tampered_wheel_is_refused(daemon, tmp_path):
    ctx = _context(tmp_path)
    wheel = ctx / ".cache" / "wheels" / load_pins()["VLLM_WHEEL"]
    data = wheel.read_bytes()
    wheel.unlink()  # break the hard link before writing
    wheel.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    proc = _build(ctx, "build")
    assert proc.returncode != 0
    assert f"verify_sha256: {wheel.name}: sha256 " in proc.stdout + proc.stderr
    assert "; refusing it" in proc.stdout + proc.stderr


def test_patch_that_does_not_apply_fails_the_build(daemon, tmp_path):
    ctx = _context(tmp_path)
    series = [ln.strip() for ln in (ctx / "patches" / "series").read_text().splitlines() if ln.strip()]
    first = ctx / "patches" / series[0]
    lines = first.read_text().splitlines(keepends=True)
    k = next(i for i, ln in enumerate(lines) if ln.startswith(" ") and ln.strip())  # first context line
    lines[k] = " # not the upstream line\n"
    first.write_text("".join(lines))
    proc = _build(ctx, "baseline")
    assert proc.returncode != 0
    assert f"apply_patches: {series[0]} does not apply to " in proc.stdout + proc.stderr


def test_harness_manifest_facts_carry_the_labels_of_a_built_image(daemon):
    image = os.environ.get("SMOKE_IMAGE", "deepinfer-sm80-smoke:deepinfer")
    if subprocess.run([DOCKER, "image", "inspect", image], capture_output=True).returncode != 0:
        pytest.fail(f"{image} missing: run make image-smoke first")
    from deepinfer_harness.run.provenance import image_facts

    facts = image_facts(image)
    labels = facts["image_labels"]
    pins = load_pins()
    assert labels["ai.deepinfer.vllm-version"] == pins["VLLM_VERSION"]
    assert labels["ai.deepinfer.vllm-sdist-sha256"] == pins["VLLM_SDIST_SHA256"]
    assert labels["ai.deepinfer.vllm-wheel-sha256"] == pins["VLLM_WHEEL_SHA256"]
    assert facts["patches"] == "00+01" and facts["patches_sha256"] == labels["ai.deepinfer.patches-sha256"]
    assert facts["image_revision"] == labels["org.opencontainers.image.revision"]
