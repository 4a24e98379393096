"""GPU microbenchmarks, one module per op (`bench/<op>.py`), each with `main(out_dir, ceilings) -> dict`.

`bench_modules()` finds them; `python -m deepinfer_sm80.bench` runs them and writes one JSON per module.
"""

from __future__ import annotations

import importlib
import pkgutil


def bench_modules() -> tuple[str, ...]:
    """Modules of this package that define `main` (helpers without one, or named `_x`, are skipped)."""
    pkg = importlib.import_module(__name__)
    names = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__, prefix=f"{__name__}."))
    public = [n for n in names if not n.rsplit(".", 1)[1].startswith("_")]
    return tuple(n for n in public if callable(getattr(importlib.import_module(n), "main", None)))
