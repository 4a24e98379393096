"""`pack_seq_triton` on e4m3 tensors through a uint8 view (Triton rejects fp8e4nv pointers below sm_89).

The pad goes in as the byte the hardware store of the fp32 pad would write (e4m3 RNE, saturating:
-inf -> 0xFE = -448), so the packed bytes equal upstream's on SM90. Both upstream entry points are
wrapped: the call, and the JIT warm-up registration that SparseAttnIndexer makes while it is
constructed (it would compile the fp8 kernel and abort startup).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0


def e4m3_pad_byte(pad_value: float | int) -> int:
    """The e4m3fn code a saturating RNE store of `pad_value` writes (NaN -> 0x7F, ±inf -> ±448)."""
    x = torch.tensor([float(pad_value)], dtype=torch.float32)
    return int(x.clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).view(torch.uint8)[0])


def pack_seq_via_uint8(upstream_pack_seq: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Factory for the `pack_seq_triton` row: e4m3 inputs are packed as bytes, others go to upstream."""

    def pack_seq_triton(
        x: torch.Tensor,
        lengths: torch.Tensor,
        pad_value: float | int = -float("inf"),
        block_t: int = 64,
        block_d: int = 64,
    ) -> torch.Tensor:
        if x.dtype != E4M3:
            return upstream_pack_seq(x, lengths, pad_value, block_t, block_d)
        packed = upstream_pack_seq(x.view(torch.uint8), lengths, e4m3_pad_byte(pad_value), block_t, block_d)
        return packed.view(E4M3)

    pack_seq_triton.deepinfer_wraps = upstream_pack_seq  # type: ignore[attr-defined]
    return pack_seq_triton


def pack_warmup_via_uint8(upstream_register_warmup: Callable[..., None]) -> Callable[..., None]:
    """Factory for `_PACK_SEQ_TRITON_KERNEL.register_warmup`: an e4m3 registration warms the uint8 key
    that `pack_seq_via_uint8` launches at run time instead."""

    def register_warmup(*args: Any, dtype: torch.dtype, pad_value: float | int, **kwargs: Any) -> None:
        if dtype == E4M3:
            dtype, pad_value = torch.uint8, e4m3_pad_byte(pad_value)
        upstream_register_warmup(*args, dtype=dtype, pad_value=pad_value, **kwargs)

    register_warmup.deepinfer_wraps = upstream_register_warmup  # type: ignore[attr-defined]
    return register_warmup
