"""Bitwise records of our kernels against upstream's on the same inputs, in the shape the bench JSONs keep
(`{"bitwise": True}` or `{"bitwise": False, "error": ...}` per implementation and case); the op tests
assert the same records hold. No Triton kernel is defined on import."""

from __future__ import annotations

from typing import Any

ERROR_CHARS = 400  # the JSON keeps the head of a mismatch message (index, values, count)


def pool_of(view: Any) -> Any:
    """The whole page pool under a strided view (a stray write outside the view shows there)."""
    return view._base if view._base is not None else view


def clone_view(view: Any) -> Any:
    """A copy of the pool with the same view over it."""
    return pool_of(view).clone().as_strided(view.shape, view.stride(), view.storage_offset())


def bitwise_record(name: str, out: Any, ref: Any) -> dict[str, object]:
    from deepinfer_sm80.testing.compare import MismatchError, assert_bitwise_equal

    try:
        assert_bitwise_equal(name, out, ref)
        return {"bitwise": True}
    except MismatchError as err:
        print(f"MISMATCH {err}")
        return {"bitwise": False, "error": str(err)[:ERROR_CHARS]}


def mismatches(records: dict[str, object], path: str = "") -> list[str]:
    """Every `case/impl` whose record says bitwise False, walking nested case dicts."""
    found: list[str] = []
    for key, value in records.items():
        if not isinstance(value, dict):
            continue
        if value.get("bitwise") is False:
            found.append(f"{path}{key}: {value.get('error', '')}")
        else:
            found += mismatches(value, f"{path}{key}/")
    return found
