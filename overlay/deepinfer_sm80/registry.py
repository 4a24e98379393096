"""Compile specs of every kernel we ship, found by walking `deepinfer_sm80.ops` (no hand list).

A module (or package module) under `ops/` that defines a module-level `COMPILE_SPECS` tuple of
`CompileSpec` (Triton) or `TILELANG_SPECS` (TileLang) is cross-compiled by `make sm80-report`;
`overlay/tests/testing/test_registry.py` checks that every such module is found and compiled.
A spec's Triton signature comes from the kernel's own parameter list (`signature`): the module names
only what the kernel does not say, its pointers' element types and any scalar that is not i32.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

OPS_PACKAGE = "deepinfer_sm80.ops"
# the repo's pointer naming: a kernel argument named `<what>_ptr` is a pointer; the ports that keep
# upstream's argument names (compress_insert, engram) name theirs in `signature(pointers=...)` instead
POINTER_SUFFIX = "_ptr"


def kernel_params(fn: Any) -> tuple[tuple[str, bool], ...]:
    """(name, is constexpr) of each argument of a Triton kernel, in order.

    A `triton.JITFunction` says it in `params`; the interpreter's twin (TRITON_INTERPRET=1) has no
    `params`, so its Python function's annotations are read the way the JIT reads them.
    """
    params = getattr(fn, "params", None)
    if params is not None:
        return tuple((p.name, bool(p.is_constexpr)) for p in params)
    inner = getattr(fn, "fn", fn)
    return tuple(
        (p.name, "constexpr" in str(p.annotation)) for p in inspect.signature(inner).parameters.values()
    )


def _kernel_name(fn: Any) -> str:
    return getattr(fn, "__name__", repr(fn))


def signature(
    fn: Any, pointers: str | Mapping[str, str], scalars: str = "i32", **types: str
) -> dict[str, str]:
    """The Triton signature of `fn`, in its argument order, from its own parameter list.

    constexpr parameters -> "constexpr"; pointers (`*_ptr` names, and every name in a `pointers`
    mapping) -> "*<dtype>", `pointers` being one element dtype for all or a name -> dtype mapping;
    every other runtime parameter -> `scalars`, or its type in `types` (e.g. eps="fp32").
    A pointer with no dtype, or a name the kernel lacks or that is of the wrong kind, is a ValueError.
    """
    kernel = _kernel_name(fn)
    params = dict(kernel_params(fn))  # name -> is constexpr, in argument order
    named = dict(pointers) if isinstance(pointers, Mapping) else {}
    for kind, names in (("pointers", named), ("types", types)):
        unknown = [n for n in names if n not in params]
        if unknown:
            raise ValueError(f"{kernel}: {kind} names {unknown}, not arguments of the kernel")
        fixed = [n for n in names if params[n]]
        if fixed:
            raise ValueError(f"{kernel}: {kind} names {fixed}, constexpr arguments (their type is constexpr)")
    is_pointer = {n: n.endswith(POINTER_SUFFIX) or n in named for n in params}
    typed_pointers = [n for n in types if is_pointer[n]]
    if typed_pointers:
        raise ValueError(f"{kernel}: types names pointers {typed_pointers}; give their dtype in pointers")
    dtypes = [*([pointers] if isinstance(pointers, str) else named.values()), scalars, *types.values()]
    starred = [t for t in dtypes if not t or t.startswith("*")]
    if starred:
        raise ValueError(f"{kernel}: {starred} are not element/scalar types (write 'bf16', not '*bf16')")
    sig: dict[str, str] = {}
    for name, is_constexpr in params.items():
        if is_constexpr:
            sig[name] = "constexpr"
        elif is_pointer[name]:
            dtype = pointers if isinstance(pointers, str) else named.get(name)
            if dtype is None:
                raise ValueError(f"{kernel}: pointer {name!r} has no dtype in pointers")
            sig[name] = f"*{dtype}"
        else:
            sig[name] = types.get(name, scalars)
    return sig


@dataclass(frozen=True)
class CompileSpec:
    """One kernel at one launch configuration: Triton signature types and constexpr values."""

    name: str
    fn: Any  # triton.JITFunction (its interpreter twin under TRITON_INTERPRET=1)
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
        params = dict(kernel_params(self.fn))
        lacking = [n for n in params if n not in self.signature]
        extra = [n for n in self.signature if n not in params]
        if lacking or extra:  # Triton matches the signature to the arguments by name, in any order
            raise ValueError(
                f"{self.name}: signature of {_kernel_name(self.fn)} lacks {lacking}, has extra {extra}"
            )
        missing = (set(self.constexprs) | set(self.divisible_by_16)) - set(self.signature)
        if missing:
            raise ValueError(f"{self.name}: {sorted(missing)} not in the signature")
        # a runtime argument the signature marks constexpr is Triton's specialisation of a None /
        # literal argument (the kernel trace records those): a value for it is allowed too
        constexpr = {n for n, c in params.items() if c} | {
            n for n, t in self.signature.items() if t == "constexpr"
        }
        runtime = sorted(set(self.constexprs) - constexpr)
        if runtime:
            raise ValueError(f"{self.name}: constexpr values for runtime arguments {runtime}")


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
