"""`make gpu-engine-bundle`: what the lent GPU (torch 2.11, triton 3.6, no vLLM, no package index) needs to
run vLLM 0.32.0's engine on the tiny V4.1 checkpoint (issue 38, scripts/gpu_engine.sh, docs/GPU_ENGINE.md).

Usage: python scripts/gpu_engine_bundle.py [--out .cache/gpu-engine] [--work /tmp/gpu-engine-tree]
Writes OUT/{vllm-base.tar.gz, vllm-optimized-delta.tar.gz, wheels/*.whl, drafter.safetensors, manifest.json,
READY}:
- vllm-base.tar.gz: the sha-checked official wheel's Python tree (`vllm/` without `third_party/` but for
  its pure-Python THIRD_PARTY modules, and its dist-info) with patch 00 applied, built by the e2e tree
  builder (`testing/e2e/tree.prepare`, the same strict `patch --fuzz=0`), minus the CPU run's compiled
  `.so` files and with its one CPU-only scratch edit undone (the GPU serves upstream's assert unchanged);
- vllm-optimized-delta.tar.gz: the files patch 01 adds or changes on top of that (the device copies the
  base site and unpacks this over it);
- wheels: the light dependencies the engine imports that the GPU image lacks or holds at other versions
  (ENGINE_WHEELS: the venv's versions, Python 3.12 manylinux builds), installed there with
  `pip install --no-index --no-deps --target`;
- drafter.safetensors: the DSpark Markov head of `make tiny-model`'s checkpoint (`drafter_file`).
The bundle travels as a carried path (64 MiB per call with the working tree): the script prints its size.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "overlay"))

# The engine's imports missing from the GPU image (device KINDS.md package list, 2026-11-17), traced by
# importing vLLM's offline engine, GPU worker, V4.1 model, DSpark and structured-output modules from the
# wheel tree (the venv's versions) with only the image's packages and these on the path (the engine's
# `vllm.parser` imports xgrammar and llguidance unguarded). transformers 5.17.0, tokenizers 0.23.2 and
# huggingface_hub 1.33.0 on the image (read 2026-12-07) satisfy vLLM 0.32.0's requirements and stay.
ENGINE_WHEELS = (
    "annotated-types==0.8.0",
    "apache-tvm-ffi==0.1.11",
    "blake3==1.0.11",
    "cachetools==8.0.3",
    "cbor2==6.3.0",
    "compressed-tensors==0.17.0",
    "depyf==0.20.0",
    "dill==0.4.1",
    "dnspython==2.9.2",
    "email-validator==2.4.0",
    "fastapi==0.136.3",
    "httpcore2==2.17.0",
    "httpx2==2.17.0",
    "ijson==3.6.0",
    "jiter==0.19.0",
    "lark==1.2.2",
    "llguidance==1.7.6",
    "msgspec==0.23.0",
    "openai==3.63.0",
    "oss-harmony==0.0.11",
    "partial-json-parser==0.2.1.1.post7",
    "pybase64==1.5.1",
    "pydantic==2.14.4",
    "pydantic-extra-types==2.11.1",
    "pydantic_core==2.50.5",
    "python-json-logger==4.2.0",
    "python-multipart==0.0.34",
    "pyzmq==27.3.0",
    "setproctitle==1.3.8",
    "sniffio==1.3.1",
    "starlette==1.10.0",
    "truststore==0.10.5",
    "typing-inspection==0.4.5",
    "xgrammar==0.2.8",
)
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (5, 17, 24, 26, 27, 28, 31, 34, 35, 38, 39)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]
SKIP_PARTS = ("vllm/third_party/",)
# ...but these pure-Python parts of it travel, read from the sha-checked official wheel and checked
# against its RECORD: `vllm.third_party.pynvml` is how vLLM detects the CUDA platform
# (`platforms/__init__.py`, `utils/import_utils.import_pynvml`; without it vLLM resolved no platform on
# the device, 2026-12-07: "Device string must not be empty"); flash_linear_attention and
# triton_kernels are Triton-only modules that layers import on some paths. The rest of third_party
# (DeepGEMM, FMHA-SM100, FA4, FlashMLA) holds compiled or sm_90+/sm_100 kernels.
THIRD_PARTY = ("vllm/third_party/__init__.py", "vllm/third_party/pynvml.py")
THIRD_PARTY_TREES = ("vllm/third_party/flash_linear_attention/", "vllm/third_party/triton_kernels/")


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def site_files(site: Path) -> dict[str, bytes]:
    """rel path -> bytes of what the GPU site serves: Python tree + dist-info, no `.so`, no stamp."""
    from deepinfer_sm80.testing.e2e.tree import SCRATCH_EDITS, STAMP

    undo = {rel: (new, old) for rel, old, new, _n, _why in SCRATCH_EDITS}
    out: dict[str, bytes] = {}
    for path in sorted(site.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(site).as_posix()
        if rel == STAMP or rel.endswith(".so") or "__pycache__" in rel or rel.startswith(SKIP_PARTS):
            continue
        data = path.read_bytes()
        if rel in undo:
            new, old = undo[rel]
            data = data.decode().replace(new, old).encode()
        out[rel] = data
    return out


def third_party_files() -> dict[str, bytes]:
    """THIRD_PARTY and the `.py` files under THIRD_PARTY_TREES, from the pinned wheel, RECORD-checked."""
    import zipfile

    from deepinfer_sm80.testing.e2e.tree import _scripts

    make_patches, pins = _scripts()
    tree = make_patches.open_tree(make_patches.default_tree())  # checks the extracted tree's wheel sha
    wheel = ROOT / ".cache" / "wheels" / pins.load_pins()["VLLM_WHEEL"]
    if sha256_of(wheel) != pins.load_pins()["VLLM_WHEEL_SHA256"]:
        raise SystemExit(f"gpu-engine-bundle: {wheel} is not the pinned wheel (VLLM_WHEEL_SHA256)")
    out: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as zf:
        for rel in zf.namelist():
            if rel in THIRD_PARTY or (rel.startswith(THIRD_PARTY_TREES) and rel.endswith(".py")):
                data = zf.read(rel)
                if make_patches.record_hash(data) != tree.record.get(rel):
                    raise SystemExit(f"gpu-engine-bundle: {rel} differs from the wheel's RECORD")
                out[rel] = data
    missing = set(THIRD_PARTY) - set(out)
    if missing:
        raise SystemExit(f"gpu-engine-bundle: the wheel lacks {sorted(missing)}")
    return out


def drafter_file(model: Path, out: Path) -> dict:
    """The DSpark Markov head of `make tiny-model`'s checkpoint (its `markov_head` tensors) -> `out`.

    The device runs the same recipe (scripts/make_tiny_v41.py), but the drafter's distillation did not
    reproduce there (2026-12-07, torch 2.11 on 16 cores: map 0947c037…, 240 samples, against 9e784fd5…,
    235 here), so the device script writes these tensors over its own and records both; every other
    tensor is seeded and must match byte for byte (the shard's sha256 says whether it does)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from deepinfer_sm80.testing.e2e.gpu import CPU_SHARD_SHA256, SHARD, shard_sha256

    if shard_sha256(model) != CPU_SHARD_SHA256:
        raise SystemExit(f"gpu-engine-bundle: {model}/{SHARD} is not gpu.CPU_SHARD_SHA256 (make tiny-model)")
    manifest = json.loads((model / "tiny_v41.json").read_text())
    with safe_open(str(model / SHARD), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if ".markov_head." in k}
    meta = {
        "shard_sha256": CPU_SHARD_SHA256,
        "recipe": manifest["recipe"],
        "drafter": json.dumps(manifest["drafter"]),
    }
    save_file(tensors, str(out), metadata=meta)
    return {"tensors": sorted(tensors), **meta}


def write_tar(files: dict[str, bytes], out: Path) -> None:
    with tarfile.open(out, "w:gz", compresslevel=9) as tar:
        for rel in sorted(files):
            info = tarfile.TarInfo(rel)
            info.size = len(files[rel])
            info.mtime = 0
            tar.addfile(info, io.BytesIO(files[rel]))


def download(dest: Path) -> None:
    platform_args = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            *platform_args,
            "-d",
            str(dest),
            *ENGINE_WHEELS,
        ],
        check=True,
    )


def probe_site(files: dict[str, bytes]) -> bool:
    """Unpack the optimized site as the device will and import the GPU run's modules in it
    (testing/e2e/gpu_probe.py): a tree that fails here would fail on the device."""
    import tempfile

    from deepinfer_sm80.testing.e2e.gpu_probe import probe

    with tempfile.TemporaryDirectory(prefix="gpu-probe-") as tmp:
        site = Path(tmp)
        for rel, data in files.items():
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / rel).write_bytes(data)
        ok, out = probe(site)
    print(out or "gpu-engine-bundle: the device-like import check passed (gpu_probe)")
    if not ok:
        print("gpu-engine-bundle: the tree fails the device-like import check: no bundle", file=sys.stderr)
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".cache" / "gpu-engine")
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpu-engine-tree"))
    ap.add_argument("--wheels-from", type=Path, default=None, help="copy wheels from here instead of pip")
    ap.add_argument(
        "--model", type=Path, default=ROOT / ".cache" / "tiny-v41", help="make tiny-model's output"
    )
    ap.add_argument(
        "--no-probe", action="store_true", help="skip the device-like import check (gpu_probe) of the tree"
    )
    args = ap.parse_args(argv)
    from deepinfer_sm80.testing.e2e.tree import TreeError, prepare

    try:
        third_party = third_party_files()
        base = site_files(prepare("base", args.work)) | third_party
        optimized = site_files(prepare("optimized", args.work)) | third_party
    except TreeError as err:
        print(f"gpu-engine-bundle: {err}", file=sys.stderr)
        return 1
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "READY").unlink(missing_ok=True)
    if not args.no_probe and not probe_site(optimized):
        return 1
    delta = {rel: data for rel, data in optimized.items() if base.get(rel) != data}
    gone = sorted(set(base) - set(optimized))
    drafter = drafter_file(args.model, out / "drafter.safetensors")
    write_tar(base, out / "vllm-base.tar.gz")
    write_tar(delta, out / "vllm-optimized-delta.tar.gz")
    wheels = out / "wheels"
    wheels.mkdir(exist_ok=True)
    for old in wheels.glob("*.whl"):
        old.unlink()
    if args.wheels_from:
        for whl in args.wheels_from.glob("*.whl"):
            (wheels / whl.name).write_bytes(whl.read_bytes())
    else:
        download(wheels)
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name not in ("READY", "manifest.json"))
    from deepinfer_sm80.testing.e2e.tree import series

    manifest = {
        "patches": {p.name: sha256_of(p) for p in series("optimized")},  # as applied (working tree)
        "wheels": list(ENGINE_WHEELS),
        "optimized_delta_files": sorted(delta),
        "optimized_removes": gone,
        "third_party": sorted(third_party),
        "drafter": drafter,
        "files": {str(p.relative_to(out)): sha256_of(p) for p in files},
        "bytes": sum(p.stat().st_size for p in files),
    }
    if gone:
        print(f"gpu-engine-bundle: patch 01 removes {len(gone)} files; the device script deletes them")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (out / "READY").write_text("ok\n")
    print(
        f"gpu-engine-bundle: {len(base)} base files, {len(delta)} in the optimized delta, "
        f"{len(list(wheels.glob('*.whl')))} wheels, {manifest['bytes'] / 2**20:.1f} MiB in {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
