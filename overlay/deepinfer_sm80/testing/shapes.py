"""Shapes for tests and benches: the model's (`formats/v41.py`, re-exported) and the named edge cases.

Tests and benches take sizes from `V41` / `V41.per_rank(tp)` and edge cases from `ODD_SHAPES`, never from
literals, so a shape has one definition.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepinfer_sm80.formats.v41 import TP_DEGREES, V41, ModelShapes, RankShapes

__all__ = ["ODD_SHAPES", "TP_DEGREES", "V41", "ModelShapes", "OddShape", "RankShapes"]


@dataclass(frozen=True)
class OddShape:
    """A named edge case: `tokens` query rows over `context` cached tokens."""

    name: str
    tokens: int
    context: int


ODD_SHAPES = (
    OddShape("single-token", 1, 1),
    OddShape("odd-T123", 123, 123),
    OddShape("window-only", 5, 100),  # context < window: no compressed entry is complete yet
    OddShape("page-crossing", 33, 161),  # crosses 32-token SWA pages and a 128-token page
    OddShape("topk-saturated", 7, 1100),  # (pos + 1) // ratio > 512 at ratio 2
    OddShape("dspark-verify", 6, 300),  # 1 + K query rows of one request
)
