"""Compile specs of every Triton kernel we ship, for cross-compilation and `make sm80-report`."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# Each module lists its kernels in a module-level tuple `COMPILE_SPECS`.
KERNEL_MODULES = (
    "deepinfer_sm80.ops.fp8",
    "deepinfer_sm80.ops.topk_swa_combine",
)


@dataclass(frozen=True)
class CompileSpec:
    """One kernel at one launch configuration: Triton signature types and constexpr values."""

    name: str
    fn: Any  # triton.JITFunction
    signature: dict[str, str]
    constexprs: dict[str, Any] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        missing = set(self.constexprs) - set(self.signature)
        if missing:
            raise ValueError(f"{self.name}: constexprs {sorted(missing)} not in the signature")


def all_specs() -> Iterator[CompileSpec]:
    for module_name in KERNEL_MODULES:
        yield from importlib.import_module(module_name).COMPILE_SPECS
