"""Compile specs of every kernel we ship, found by walking `deepinfer_sm80.ops` (no hand list).

A module (or package module) under `ops/` that defines a module-level `COMPILE_SPECS` tuple of
`CompileSpec` (Triton) or `TILELANG_SPECS` (TileLang) is cross-compiled by `make sm80-report`;
`overlay/tests/testing/test_registry.py` checks that every such module is found and compiled.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

OPS_PACKAGE = "deepinfer_sm80.ops"


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
    # the arches this spec is compiled for (None: every arch of the report); upstream's hardware-fp8
    # writers that Ada keeps are compiled for sm_89 only (they fail below it by design)
    archs: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        missing = (set(self.constexprs) | set(self.divisible_by_16)) - set(self.signature)
        if missing:
            raise ValueError(f"{self.name}: {sorted(missing)} not in the signature")


@dataclass(frozen=True)
class TileLangSpec:
    """One TileLang kernel at one compile-time configuration.

    `kernel` is "package.module:attr" of a `tilelang.jit` function; `params` its compile-time
    (non-tensor) arguments. `upstream=True` marks vLLM's own kernels (compiled with vLLM's flags).
    """

    name: str
    kernel: str
    params: dict[str, Any] = field(default_factory=dict)
    upstream: bool = False


def kernel_modules(package: str = OPS_PACKAGE, attr: str = "COMPILE_SPECS") -> tuple[str, ...]:
    """Every module under `package` that defines `attr` (COMPILE_SPECS or TILELANG_SPECS), in walk order."""
    root = importlib.import_module(package)
    names = [package, *(m.name for m in pkgutil.walk_packages(root.__path__, prefix=f"{package}."))]
    return tuple(n for n in names if hasattr(importlib.import_module(n), attr))


def all_specs(package: str = OPS_PACKAGE) -> Iterator[CompileSpec]:
    """Triton kernels."""
    for module_name in kernel_modules(package):
        yield from importlib.import_module(module_name).COMPILE_SPECS


def tilelang_specs(package: str = OPS_PACKAGE) -> Iterator[TileLangSpec]:
    """TileLang kernels (`TileLangSpec`), ours and the upstream ones we launch."""
    for module_name in kernel_modules(package, "TILELANG_SPECS"):
        yield from importlib.import_module(module_name).TILELANG_SPECS
