"""Engram at a pipeline stage's first layer (binding row `pp_engram_entry`).

V4.1's decoder layer injects Engram between the previous layer's mHC post and its own pre
(`models/deepseek_v41/nvidia/model.py` L531-558): the branch taken when a residual stream is carried in.
The first layer of a non-first pipeline stage is handed the previous stage's collapsed stream with
`residual=None` and takes the other branch (L494-530: `residual = x`, then the pre), which has no
injection, so an Engram layer that opens a stage (layer 14 at 14,14,12) is silently skipped and the
tokens change with no error. The received stream is exactly the `previous_post` the single-stage branch
injects into (the sending stage's `_collapse` ran the post), so this row injects into it before
upstream's layer runs; upstream then takes its own branch on the injected stream, as the single stage
takes its pre on the injected residual. Every other call is upstream's, untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def opens_stage_with_engram(layer: Any, x: Any, residual: Any, engram_hashes: Any) -> bool:
    """A carried-in (3-D, [T, hc, H]) stream with no residual at a layer that has Engram and hashes."""
    return (
        residual is None
        and engram_hashes is not None
        and getattr(layer, "engram", None) is not None
        and getattr(x, "dim", lambda: 0)() == 3
    )


def wrap_decoder_forward(upstream: Callable[..., Any]) -> Callable[..., Any]:
    """Binding `pp_engram_entry`: DeepseekV4DecoderLayer.forward with the stage-entry injection."""

    def forward(
        self: Any,
        x: Any,
        positions: Any,
        input_ids: Any,
        pre_mix: Any = None,
        post_mix: Any = None,
        res_mix: Any = None,
        residual: Any = None,
        engram_hashes: Any = None,
        engram_mask: Any = None,
        **kwargs: Any,
    ) -> Any:
        if opens_stage_with_engram(self, x, residual, engram_hashes):
            x = self.engram(x, engram_hashes[:, self.engram.layer_hash_index], engram_mask)
        return upstream(
            self, x, positions, input_ids, pre_mix, post_mix, res_mix, residual, engram_hashes, engram_mask,
            **kwargs,
        )  # fmt: skip

    return forward
