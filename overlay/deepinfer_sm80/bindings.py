"""The one binding table: each upstream vLLM 0.32.0 symbol we replace, with its base and DeepInfer versions.

Patch 00 ends every upstream module that has rows with `rebind(globals(), __name__)`; the gate, the level
and the opt-outs live here, never in the patch (docs/LAYOUT.md). Patch 01 only adds the level marker.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

LOG = logging.getLogger("deepinfer_sm80")

# First capability with hardware e4m3 conversions (sm_89): below it, upstream's fp8 Triton/CuTeDSL paths fail.
HW_FP8_CAPABILITY = 89
# Rows that are not about the architecture (pipeline replication) apply on every capability.
EVERY_CAPABILITY = 1000
LEVEL_MARKER = "vllm.deepinfer_sm80_level"  # created by patch 01 only
ENV_DISABLE = "DEEPINFER_SM80_DISABLE"  # comma-separated row names sent back to base
ENV_FORCE_CAPABILITY = "DEEPINFER_SM80_FORCE_CAPABILITY"  # e.g. 80: route an H200 through the SM8x rows
LEVELS = ("base", "optimized")


@dataclass(frozen=True)
class Binding:
    """One replaced upstream symbol. Targets are "package.module:attr" strings, imported only when bound.

    `base=None` keeps upstream's own object at the base level; `optimized=None` means "same as base".
    `wrap=True`: the target is a factory `f(upstream_object) -> replacement` (gates, wrappers).
    The row applies on CUDA devices of capability < `below` (8.0/8.6 by default).
    """

    name: str
    module: str
    symbol: str  # a module global, or "Class.attr"
    base: str | None
    optimized: str | None
    why: str
    below: int = HW_FP8_CAPABILITY
    wrap: bool = False

    def __post_init__(self) -> None:
        if self.base is None and self.optimized is None:
            raise ValueError(f"binding {self.name}: neither a base nor an optimized target")
        for target in (self.base, self.optimized):
            if target is not None and target.count(":") != 1:
                raise ValueError(f"binding {self.name}: target {target!r} is not 'package.module:attr'")

    def target(self, level: str) -> str | None:
        """The implementation this row binds at `level`; None = upstream's own."""
        if level not in LEVELS:
            raise ValueError(f"unknown level {level!r}; expected one of {LEVELS}")
        if level == "optimized" and self.optimized is not None:
            return self.optimized
        return self.base


_CACHE = "deepinfer_sm80.ops"
BINDINGS: tuple[Binding, ...] = (
    Binding(
        name="kv_insert",
        module="vllm.models.deepseek_v41.common.ops.cache_utils",
        symbol="quantize_and_insert_k_cache",
        base=f"{_CACHE}.kv_quant_insert:base_quantize_and_insert_k_cache",
        optimized=f"{_CACHE}.kv_quant_insert:quantize_and_insert_k_cache",
        why="upstream's writer uses tl.float8e4nv (sm_89+); software e4m3, same bytes",
    ),
    Binding(
        name="kv_gather",
        module="vllm.models.deepseek_v41.common.ops.cache_utils",
        symbol="dequantize_and_gather_k_cache",
        base=f"{_CACHE}.kv_gather:base_dequantize_and_gather_k_cache",
        optimized=f"{_CACHE}.kv_gather:dequantize_and_gather_k_cache",
        why="CuTeDSL (sm_90) and tl.float8e4nv paths; software e4m3, one-pass gather at the DeepInfer level",
    ),
    Binding(
        name="topk_swa_combine",
        module="vllm.models.deepseek_v41.common.ops.cache_utils",
        symbol="combine_topk_swa_indices",
        base=None,
        optimized=f"{_CACHE}.topk_swa_combine:combine_topk_swa_indices",
        why="upstream's combiner runs on sm_80 as is (the baseline); ours is one warp per token",
    ),
)


# ----------------------------------------------------------------------------- selection
def active_level() -> str:
    """'optimized' where patch 01's marker module is installed, else 'base'."""
    try:
        marker = importlib.import_module(LEVEL_MARKER)
    except ImportError:
        return "base"
    level = getattr(marker, "LEVEL", "base")
    if level not in LEVELS:
        raise ValueError(f"{LEVEL_MARKER}.LEVEL = {level!r}; expected one of {LEVELS}")
    return level


def disabled_names(environ: MutableMapping[str, str] | None = None) -> frozenset[str]:
    """Row names in DEEPINFER_SM80_DISABLE; an unknown name is an error (a typo must not pass silently)."""
    raw = (environ if environ is not None else os.environ).get(ENV_DISABLE, "")
    names = frozenset(n.strip() for n in raw.split(",") if n.strip())
    unknown = names - {b.name for b in BINDINGS}
    if unknown:
        known = ", ".join(sorted(b.name for b in BINDINGS))
        raise ValueError(f"{ENV_DISABLE}: unknown binding(s) {sorted(unknown)}; known: {known}")
    return names


def row_applies(row: Binding, capability: int | None) -> bool:
    """capability = major*10+minor of the CUDA device, None when not on CUDA."""
    return capability is not None and capability < row.below


def device_capability(environ: MutableMapping[str, str] | None = None) -> int | None:
    """The CUDA capability as vLLM's platform reports it (NVML: no CUDA context), or the forced value."""
    forced = (environ if environ is not None else os.environ).get(ENV_FORCE_CAPABILITY)
    if forced:
        if not forced.isdigit():
            raise ValueError(f"{ENV_FORCE_CAPABILITY}={forced!r}: expected an integer such as 80 or 86")
        return int(forced)
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return None
    # has_device_capability is what upstream's own gates call (and what tests fake)
    for cap in (120, 110, 103, 100, 90, 89, 87, 86, 80, 75, 70):
        if current_platform.has_device_capability(cap):
            return cap
    return 0


def resolve(target: str) -> Any:
    module_name, attr = target.split(":")
    return getattr(importlib.import_module(module_name), attr)


def rows_for(module_name: str) -> Iterator[Binding]:
    return (b for b in BINDINGS if b.module == module_name)


def hooked_modules() -> tuple[str, ...]:
    """Every upstream module patch 00 must hook, in table order."""
    return tuple(dict.fromkeys(b.module for b in BINDINGS))


def selection(
    module_name: str, capability: int | None, level: str, disabled: frozenset[str]
) -> dict[str, str | None]:
    """Row name -> target bound (None = upstream's own) for one module, as `rebind` would choose."""
    chosen: dict[str, str | None] = {}
    for row in rows_for(module_name):
        if row_applies(row, capability):
            chosen[row.name] = row.target("base" if row.name in disabled else level)
    return chosen


# ----------------------------------------------------------------------------- the hook
_LOGGED: set[str] = set()
_ORIGINALS_KEY = "__deepinfer_sm80_originals__"  # kept in the module's own globals


def _get(namespace: MutableMapping[str, Any], symbol: str) -> Any:
    head, _, attr = symbol.partition(".")
    return getattr(namespace[head], attr) if attr else namespace[head]


def _set(namespace: MutableMapping[str, Any], symbol: str, value: Any) -> None:
    head, _, attr = symbol.partition(".")
    if attr:
        setattr(namespace[head], attr, value)
    else:
        namespace[head] = value


def rebind(namespace: MutableMapping[str, Any], module_name: str) -> dict[str, str | None]:
    """Apply this module's rows to its globals (called at the end of the patched upstream module).

    Returns row name -> bound target for the rows that apply here. Idempotent: re-running the hook
    (a module reloaded in tests) wraps upstream's original again, never a replacement.
    """
    capability = device_capability()
    chosen = selection(module_name, capability, active_level(), disabled_names())
    for row in rows_for(module_name):
        if row.name not in chosen:
            continue
        saved = namespace.setdefault(_ORIGINALS_KEY, {})
        if row.symbol not in saved:  # a second run of the hook must wrap upstream's object, not ours
            saved[row.symbol] = _get(namespace, row.symbol)
        original = saved[row.symbol]
        target = chosen[row.name]
        if target is None:
            _set(namespace, row.symbol, original)
            continue
        impl = resolve(target)
        _set(namespace, row.symbol, impl(original) if row.wrap else impl)
    _log_once(module_name, capability, chosen)
    return chosen


def _log_once(module_name: str, capability: int | None, chosen: dict[str, str | None]) -> None:
    if module_name in _LOGGED or not chosen:
        return
    _LOGGED.add(module_name)
    parts = ", ".join(f"{name}={target or 'upstream'}" for name, target in chosen.items())
    level = active_level()
    LOG.info("DeepInfer-SM80 level %s on capability %s: %s: %s", level, capability, module_name, parts)


def describe(capability: int | None, level: str | None = None) -> list[dict[str, str | None]]:
    """Every row with the target it would bind on `capability` (for startup logs and `make validate`)."""
    level = level or active_level()
    disabled = disabled_names()
    out = []
    for row in BINDINGS:
        applies = row_applies(row, capability)
        target = row.target("base" if row.name in disabled else level) if applies else None
        out.append({"name": row.name, "module": row.module, "symbol": row.symbol, "bound": target})
    return out


def original(module_name: str, symbol: str) -> Callable[..., Any] | None:
    """Upstream's own object for a rebound symbol (for tests and for wrappers that fall back)."""
    module = sys.modules.get(module_name)
    saved = getattr(module, _ORIGINALS_KEY, {}) if module is not None else {}
    return saved.get(symbol)
