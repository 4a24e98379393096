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
    "deepinfer_sm80.ops.kv_quant_insert",
    "deepinfer_sm80.ops.kv_gather",
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
    # arguments a production launch passes 16-divisible (pointers, strides): the JIT specialises
    # on that at run time, so the cross-compile must too to see the same vector widths
    divisible_by_16: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        missing = (set(self.constexprs) | set(self.divisible_by_16)) - set(self.signature)
        if missing:
            raise ValueError(f"{self.name}: {sorted(missing)} not in the signature")


def all_specs() -> Iterator[CompileSpec]:
    for module_name in KERNEL_MODULES:
        yield from importlib.import_module(module_name).COMPILE_SPECS
