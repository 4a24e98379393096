"""Strict JSON for every file the harness writes: never a NaN or Infinity token.

Python's json writes `NaN` and `Infinity` by default; RFC 8259 has no such tokens and jq,
JavaScript and most readers refuse the file. Every value is made plain before it is written:
NaN (an undefined number) becomes null; +inf and -inf become the strings "inf" and "-inf" (a
rate of inf requests/s sends every request at once; a z of ±inf means every position moved
alike), so the meaning survives while the file stays strict; the key beside a rate names its
unit. numpy scalars and arrays become plain numbers and lists. `json.dumps(…, allow_nan=False)`
then guarantees the result.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

INF, NEG_INF = "inf", "-inf"


def plain(value: Any) -> Any:
    """`value` with every non-finite float replaced (see the module docstring), recursively."""
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float | np.floating):
        x = float(value)
        if math.isnan(x):
            return None
        if math.isinf(x):
            return INF if x > 0 else NEG_INF
        return x
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [plain(v) for v in value]
    return _default(value)


def _default(value: Any) -> Any:
    """What json cannot encode itself: numpy scalars and arrays, else the value's text."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)  # a Path, a datetime: as the old writer's default=str wrote them


def dumps(data: Any, **kwargs: Any) -> str:
    """Strict json.dumps: never a NaN or Infinity token. The C encoder runs first (a record is
    written on the event loop while requests stream: a Python walk over a 100K-position
    prompt-logprob list would stall it); only data holding a non-finite number is made `plain`."""
    try:
        return json.dumps(data, allow_nan=False, default=_default, **kwargs)
    except ValueError:  # a NaN or ±inf somewhere
        return json.dumps(plain(data), allow_nan=False, default=_default, **kwargs)


def number(value: Any) -> Any:
    """The inverse for one value read back: "inf" / "-inf" → ±inf; anything else unchanged."""
    if value == INF:
        return math.inf
    if value == NEG_INF:
        return -math.inf
    return value


def numbers(value: Any) -> Any:
    """`number` applied through dicts and lists (profile values read back from a manifest)."""
    if isinstance(value, dict):
        return {k: numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        if not any(isinstance(v, str | list | dict) for v in value):  # a list of numbers: as it is
            return value
        return [numbers(v) for v in value]
    return number(value)
