"""Config-only variants of a checkpoint: same weights (symlinked), a few text_config fields changed.

With the released `index_topk` 512, a prompt of at most 512·ratio tokens takes V4.1's short-context
branch (`models/deepseek_v41/attention.py:1483`) and the indexer never runs; lowering `index_topk`
(and `candidate_topk_blocks`, which bounds layer 5's candidate-masked pass, 2048 blocks of 8 states
at release) in config.json alone makes a prompt of a few dozen tokens select for real. Weight shapes
do not depend on either field.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from deepinfer_sm80.testing.e2e import check_checkpoint

# The long-context variant: top-16 of the compressed states, so a 66-token prompt (66 states at ratio 1,
# 33 at ratio 2) selects in every indexer; layer 5 masked to 64 candidate blocks of 8, the fewest the
# streamed top-k takes (`ops/indexer/stream.py:455`: candidate columns a multiple of its 512 span).
SELECTING = {"index_topk": 16, "candidate_topk_blocks": 64}


def variant(ckpt: Path, work: Path, overrides: dict[str, object]) -> Path:
    """A directory holding ckpt's files (symlinks) with `overrides` applied to config.json's text_config."""
    cfg = check_checkpoint(ckpt)
    if not overrides:
        return Path(ckpt)
    text = cfg.get("text_config", cfg)
    unknown = sorted(k for k in overrides if k not in text)
    if unknown:
        raise KeyError(f"{ckpt}/config.json: no text_config field {unknown}")
    tag = hashlib.sha256(json.dumps(overrides, sort_keys=True).encode()).hexdigest()[:10]
    out = Path(work) / "models" / f"{Path(ckpt).resolve().name}-{tag}"
    out.mkdir(parents=True, exist_ok=True)
    for src in Path(ckpt).resolve().iterdir():
        if src.name == "config.json" or src.name.startswith("."):
            continue
        link = out / src.name
        if link.is_symlink() or link.exists():
            if link.is_symlink() and link.resolve() == src.resolve():
                continue
            link.unlink()
        link.symlink_to(src.resolve())
    text.update(overrides)
    (out / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return out


def fingerprint(ckpt: Path) -> str:
    """sha256 over the checkpoint's file names, sizes and mtimes (cheap; a rebuild changes it)."""
    h = hashlib.sha256()
    for path in sorted(Path(ckpt).resolve().iterdir()):
        if path.is_file() and not path.name.startswith("."):
            st = path.stat()
            h.update(f"{path.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def snapshot(ckpt: Path, work: Path) -> Path:
    """A private copy of the checkpoint for one run: the engines and the oracle must read the same
    bytes, and `make tiny-model` may rebuild the shared one mid-run (it did, here, 2026-12-02)."""
    check_checkpoint(ckpt)
    src = Path(ckpt).resolve()
    out = Path(work) / "snapshots" / f"{src.name}-{fingerprint(src)[:12]}"
    stamp = out / ".complete"
    if stamp.exists():
        return out
    if out.exists():
        shutil.rmtree(out)
    staging = out.with_name(out.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    for path in sorted(src.iterdir()):
        if path.is_file() and not path.name.startswith("."):
            shutil.copyfile(path, staging / path.name)
    (staging / ".complete").write_text(fingerprint(src) + "\n")
    staging.rename(out)
    for old in out.parent.glob(f"{src.name}-*"):  # earlier snapshots of a rebuilt checkpoint
        if old != out and not old.name.endswith(".partial"):
            shutil.rmtree(old, ignore_errors=True)
    return out
