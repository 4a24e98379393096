"""`make fetch-vllm`: the pinned official vLLM wheel, sha256-checked, its pure-Python tree extracted.

Usage: python scripts/fetch_vllm.py [CACHE_DIR]  ->  CACHE_DIR/vllm-<version>/{vllm/, *.dist-info/}
Idempotent: a stamp file records the wheel's sha256; a finished tree is not extracted twice.
"""

from __future__ import annotations

import shutil
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fetch_wheel import ChecksumError, fetch
from pins import load_pins

STAMP = ".extracted-from-sha256"


def wanted(name: str, dist_info: str) -> bool:
    """Python sources of the vllm package (third_party excluded: compiled-kernel bundles) + dist-info."""
    if name.startswith(dist_info + "/"):
        return True
    return name.startswith("vllm/") and name.endswith(".py") and not name.startswith("vllm/third_party/")


def extract_tree(wheel: Path, sha256: str, tree: Path) -> Path:
    stamp = tree / STAMP
    if stamp.exists() and stamp.read_text().strip() == sha256:
        return tree
    tmp = tree.with_name(tree.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        dist_info = next(n.split("/")[0] for n in zf.namelist() if ".dist-info/" in n)
        for name in zf.namelist():
            if wanted(name, dist_info):
                zf.extract(name, tmp)
    (tmp / STAMP).write_text(sha256 + "\n")
    shutil.rmtree(tree, ignore_errors=True)
    tmp.rename(tree)
    return tree


def main() -> int:
    pins = load_pins()
    cache = Path(sys.argv[1] if len(sys.argv) > 1 else ".cache")
    try:
        wheel = fetch(
            f"vllm=={pins['VLLM_VERSION']}", pins["VLLM_WHEEL"], pins["VLLM_WHEEL_SHA256"], cache / "wheels"
        )
    except ChecksumError as exc:
        print(f"fetch-vllm: {exc}", file=sys.stderr)
        return 1
    tree = extract_tree(wheel, pins["VLLM_WHEEL_SHA256"], cache / f"vllm-{pins['VLLM_VERSION']}")
    print(f"fetch-vllm: {tree} ({sum(1 for _ in tree.rglob('*.py'))} Python files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
