"""GPU microbenchmarks, one module per op (`bench/<op>.py`), each with `main(out_dir, ceilings) -> dict`.

`bench_modules()` finds them; `python -m deepinfer_sm80.bench` runs them and writes one JSON per module.
"""

from __future__ import annotations

import importlib
import pkgutil


def bench_modules() -> tuple[str, ...]:
    pkg = importlib.import_module(__name__)
    names = (m.name for m in pkgutil.iter_modules(pkg.__path__, prefix=f"{__name__}."))
    return tuple(n for n in sorted(names) if not n.rsplit(".", 1)[1].startswith("_"))
