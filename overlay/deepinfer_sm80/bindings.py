"""`deepinfer_sm80.bindings`: the binding table and the hook that applies it, under the one name patch 00
imports (`from deepinfer_sm80.bindings import rebind; rebind(globals(), __name__)`).

The rows and their vocabulary (`BINDINGS`, `Binding`, `LEVELS`, `ENV_DISABLE`, ...) live in `table.py`;
the hook's names (`rebind`, `active_level`, `device_capability`, `original`, ...) in `hook.py`, which
reads the table. This module stands above both and holds nothing itself: each attribute is looked up in
the table, then the hook, at every access, so what a reader sees here is what the hook sees (a test that
replaces `table.BINDINGS` replaces it for both). An attribute set on this module wins over both lookups:
the e2e coverage wraps `rebind` here before the patched modules import it.
"""

from __future__ import annotations

from typing import Any

from deepinfer_sm80 import hook, table


def __getattr__(name: str) -> Any:
    for module in (table, hook):
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(dir(table)) | set(dir(hook)))
