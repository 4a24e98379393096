"""The hook patch 00 calls at the end of every upstream module that has rows: `rebind(globals(), __name__)`.

It chooses, per row of the binding table (`table.py`), upstream's object, the base or the optimized
target: the row applies below its capability, the level comes from patch 01's marker, and
DEEPINFER_SM80_DISABLE sends named rows back to base (docs/LAYOUT.md). The table is read through the
`table` module at call time, so a test that replaces `table.BINDINGS` is what the hook sees. Patch 00
imports these names through `bindings.py`, which stands above this module and the table.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

from deepinfer_sm80 import table
from deepinfer_sm80.table import ENV_DISABLE, ENV_FORCE_CAPABILITY, FEATURES, LEVEL_MARKER, LEVELS, Binding

LOG = logging.getLogger("deepinfer_sm80")


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
    unknown = names - {b.name for b in table.BINDINGS} - set(FEATURES)
    if unknown:
        known = ", ".join(sorted(b.name for b in table.BINDINGS))
        raise ValueError(
            f"{ENV_DISABLE}: unknown binding(s) {sorted(unknown)}; known: {known}; "
            f"features: {', '.join(FEATURES)}"
        )
    return names


def feature_enabled(name: str, environ: MutableMapping[str, str] | None = None) -> bool:
    """A FEATURES entry is on at the optimized level unless DEEPINFER_SM80_DISABLE names it."""
    if name not in FEATURES:
        raise ValueError(f"unknown feature {name!r}; expected one of {FEATURES}")
    return active_level() == "optimized" and name not in disabled_names(environ)


def feature_states(environ: MutableMapping[str, str] | None = None) -> dict[str, bool]:
    return {name: feature_enabled(name, environ) for name in FEATURES}


def row_applies(row: Binding, capability: int | None) -> bool:
    """capability = major*10+minor of the CUDA device, None when not on CUDA."""
    return capability is not None and capability < row.below


class CapabilityUnknown(RuntimeError):
    """A CUDA process whose device capability vLLM's platform cannot read (NVML failed)."""


def device_capability(environ: MutableMapping[str, str] | None = None) -> int | None:
    """The CUDA capability as vLLM's platform reports it, major*10+minor, or the forced value.

    Read as vLLM reads it: `current_platform.get_device_capability()` (NVML on CUDA, no CUDA context;
    `DeviceCapability.to_int()`). None when not on CUDA. On CUDA with no answer (NVML failed: vLLM's
    platform returns None, and its own `has_device_capability` then answers False for every gate), the
    rows cannot be chosen: an H100 must not get the SM8x rows nor an A100 upstream's FlashMLA, so this
    refuses with one line naming the override.
    """
    forced = (environ if environ is not None else os.environ).get(ENV_FORCE_CAPABILITY)
    if forced:
        if not forced.isdigit():
            raise ValueError(f"{ENV_FORCE_CAPABILITY}={forced!r}: expected an integer such as 80 or 86")
        return int(forced)
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return None
    cap = current_platform.get_device_capability()
    if cap is None:
        raise CapabilityUnknown(
            "DeepInfer-SM80: vLLM's platform could not read the CUDA device capability (NVML); the binding "
            f"table cannot tell SM8x from SM90+. Fix NVML access or set {ENV_FORCE_CAPABILITY} (e.g. 80, 86, "
            "89, 90) to the GPU's capability"
        )
    return int(cap.to_int())


def resolve(target: str) -> Any:
    module_name, attr = target.split(":")
    return getattr(importlib.import_module(module_name), attr)


def rows_for(module_name: str) -> Iterator[Binding]:
    return (b for b in table.BINDINGS if b.module == module_name)


def hooked_modules() -> tuple[str, ...]:
    """Every upstream module patch 00 must hook, in table order."""
    return tuple(dict.fromkeys(b.module for b in table.BINDINGS))


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


_REQUIRED = object()
ABSENT = object()  # the "original" of an `adds` row: upstream's class has no such attribute


def _get(namespace: MutableMapping[str, Any], symbol: str, default: Any = _REQUIRED) -> Any:
    head, _, attr = symbol.partition(".")
    if not attr:
        return namespace[head]
    if default is _REQUIRED:
        return getattr(namespace[head], attr)
    return getattr(namespace[head], attr, default)


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
            saved[row.symbol] = _get(namespace, row.symbol, ABSENT if row.adds else _REQUIRED)
        original = saved[row.symbol]
        target = chosen[row.name]
        if target is None:
            _set(namespace, row.symbol, original)
            continue
        impl = resolve(target)
        _set(namespace, row.symbol, impl(original) if row.wrap else impl)
    _log_once(module_name, capability, chosen)
    _log_features_once(capability, chosen)
    return chosen


def _log_once(module_name: str, capability: int | None, chosen: dict[str, str | None]) -> None:
    if module_name in _LOGGED or not chosen:
        return
    _LOGGED.add(module_name)
    parts = ", ".join(f"{name}={target or 'upstream'}" for name, target in chosen.items())
    level = active_level()
    LOG.info("DeepInfer-SM80 level %s on capability %s: %s: %s", level, capability, module_name, parts)


_FEATURES_LOGGED: list[bool] = []


def _log_features_once(capability: int | None, chosen: dict[str, str | None]) -> None:
    """The feature set, once per process, beside the first module whose rows apply (SM8x only)."""
    if _FEATURES_LOGGED or not chosen:
        return
    _FEATURES_LOGGED.append(True)
    parts = ", ".join(f"{name}={'on' if on else 'off'}" for name, on in feature_states().items())
    level = active_level()
    LOG.info("DeepInfer-SM80 features at the %s level on capability %s: %s", level, capability, parts)


def describe(capability: int | None, level: str | None = None) -> list[dict[str, str | None]]:
    """Every row with the target it would bind on `capability` (for startup logs and `make validate`)."""
    level = level or active_level()
    disabled = disabled_names()
    out = []
    for row in table.BINDINGS:
        applies = row_applies(row, capability)
        target = row.target("base" if row.name in disabled else level) if applies else None
        out.append({"name": row.name, "module": row.module, "symbol": row.symbol, "bound": target})
    return out


def original(module_name: str, symbol: str) -> Callable[..., Any] | None:
    """Upstream's own object for a rebound symbol (for tests and for wrappers that fall back)."""
    module = sys.modules.get(module_name)
    saved = getattr(module, _ORIGINALS_KEY, {}) if module is not None else {}
    found = saved.get(symbol)
    return None if found is ABSENT else found
