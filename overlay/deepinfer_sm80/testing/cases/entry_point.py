"""What the entry-point A/B (scripts/entry_point_ab.py) runs per binding row, found in the op case modules.

A module `testing/cases/<op>.py` declares `ENTRY_POINT_CASES = {row name: shapes(quick) -> Shape...}` next
to its other cases; `entry_point_cases()` collects them, so the A/B script holds no case of its own.
Importing a case module defines no Triton kernel (the GPU-side builders import at call time).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

CASES_PACKAGE = "deepinfer_sm80.testing.cases"


@dataclass(frozen=True)
class Shape:
    label: str
    size: int
    bytes_moved: int
    make: Callable[[], Callable[[Callable[..., Any], int], Any]]  # -> run(fn, set_index) -> outputs
    n_sets: int
    check: Callable[[Any, Any], str]  # (optimized outputs, base outputs) -> verdict


def bitwise(a: Any, b: Any) -> str:
    import torch

    a, b = (a if isinstance(a, list | tuple) else [a]), (b if isinstance(b, list | tuple) else [b])
    same = all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b, strict=True))
    return "bitwise" if same else "mismatch"


ShapesFn = Callable[[bool], Iterator[Shape]]


def entry_point_cases(package: str = CASES_PACKAGE) -> dict[str, ShapesFn]:
    """Row name -> its shapes, from every case module's ENTRY_POINT_CASES; a row claimed twice is an error."""
    root = importlib.import_module(package)
    found: dict[str, ShapesFn] = {}
    for info in pkgutil.iter_modules(root.__path__):
        module = importlib.import_module(f"{package}.{info.name}")
        for row, shapes in getattr(module, "ENTRY_POINT_CASES", {}).items():
            if row in found:
                raise ValueError(f"{package}.{info.name}: entry-point case {row!r} is declared twice")
            found[row] = shapes
    return found
