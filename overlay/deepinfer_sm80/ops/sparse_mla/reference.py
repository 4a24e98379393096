"""fp32 PyTorch references of sparse MLA decode and prefill (docs/SPARSE_MLA.md): plain softmax per query.

Slot lists are (dense row, length) or ragged (indices, indptr); a slot counts when its position is below
the length and 0 <= slot < rows. Decode K rows are dequantized records with NaN -> 0 (inf kept); prefill
K rows are the bf16 workspace as is.
"""

from __future__ import annotations

import torch

from deepinfer_sm80.formats.fp8_ds_mla import GROUP, N_GROUPS, NOPE_DIM, ROPE_DIM, token_views
from deepinfer_sm80.ops.fp8 import e4m3_decode_ref, ue8m0_decode_ref


def slot_lists(
    num_queries: int,
    dense: torch.Tensor | None,
    lens: torch.Tensor | None,
    ragged: torch.Tensor | None,
    indptr: torch.Tensor | None,
    num_rows: int,
) -> list[torch.Tensor]:
    """Per query, the valid slots in list order (int64, on CPU)."""
    out = []
    for qi in range(num_queries):
        if ragged is not None and indptr is not None:
            lo, hi = int(indptr[qi]), int(indptr[qi + 1])
            row = ragged.reshape(-1)[lo:hi].long().cpu()
        else:
            assert dense is not None
            row = dense.reshape(dense.shape[0], -1)[qi].long().cpu()
            n = int((row >= 0).sum()) if lens is None else int(lens.reshape(-1)[qi])
            row = row[: max(0, min(n, row.numel()))]
        out.append(row[(row >= 0) & (row < num_rows)])
    return out


def dequant_records(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """[n] slots of a [blocks, bs, 584] cache -> [n, 512] fp32: bf16(e4m3 x 2^(u-127)) | RoPE, NaN -> 0."""
    bs = cache.shape[1]
    data, scale = token_views(cache.cpu(), bs)
    rec = data[slots // bs, slots % bs]  # [n, 576]
    u = scale[slots // bs, slots % bs, :N_GROUPS]  # [n, 7]
    nope = e4m3_decode_ref(rec[:, :NOPE_DIM]).reshape(-1, N_GROUPS, GROUP) * ue8m0_decode_ref(u)[..., None]
    nope = nope.reshape(-1, NOPE_DIM).bfloat16().float()  # [n, 448]
    rope = rec[:, NOPE_DIM:].contiguous().view(torch.bfloat16).float()  # [n, 64]
    k = torch.cat([nope, rope], dim=1)  # [n, 512]
    return torch.where(k.isnan(), torch.zeros_like(k), k)


def attend(q: torch.Tensor, k: torch.Tensor, sink: torch.Tensor | None, scale: float) -> torch.Tensor:
    """q [H, 512], k [n, 512] fp32 -> [H, 512] fp32: softmax of n scores plus the sink (denominator only)."""
    heads = q.shape[0]
    if k.shape[0] == 0:
        return torch.zeros(heads, k.shape[1])
    s = (q @ k.T) * scale  # [H, n]
    if sink is not None:
        s = torch.cat([s, sink.float()[:, None]], dim=1)  # [H, n + 1]
    m = s.max(dim=1, keepdim=True).values
    e = torch.exp(s - m)
    p = e / e.sum(dim=1, keepdim=True)
    return p[:, : k.shape[0]] @ k  # [H, 512]


def inverse_rope(o: torch.Tensor, pos: int, cos_sin: torch.Tensor) -> torch.Tensor:
    """GPT-J inverse rotation of lanes 448..511 of o [H, 512] at `pos` (cos | sin halves), fp32."""
    half = ROPE_DIM // 2
    cos, sin = cos_sin[pos, :half].float(), cos_sin[pos, half:].float()
    out = o.clone()
    even, odd = o[:, NOPE_DIM::2], o[:, NOPE_DIM + 1 :: 2]
    out[:, NOPE_DIM::2] = even * cos + odd * sin
    out[:, NOPE_DIM + 1 :: 2] = odd * cos - even * sin
    return out


def decode_ref(
    q: torch.Tensor,
    swa_cache: torch.Tensor,
    swa: list[torch.Tensor],
    kv_cache: torch.Tensor | None,
    topk: list[torch.Tensor] | None,
    attn_sink: torch.Tensor | None,
    scale: float,
    positions: torch.Tensor | None = None,
    cos_sin: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [Tq, H, 512] bf16, per-query slot lists -> [Tq, H, 512] bf16 (SWA rows, then top-k rows)."""
    out = torch.zeros(q.shape, dtype=torch.float32)
    sink = attn_sink[: q.shape[1]].cpu() if attn_sink is not None else None
    for qi in range(q.shape[0]):
        k = dequant_records(swa_cache, swa[qi])
        if kv_cache is not None and topk is not None:
            k = torch.cat([k, dequant_records(kv_cache, topk[qi])])
        o = attend(q[qi].float().cpu(), k, sink, scale)
        if positions is not None and cos_sin is not None:
            o = inverse_rope(o, int(positions[qi]), cos_sin.cpu())
        out[qi] = o
    return out.bfloat16()


def prefill_ref(
    q: torch.Tensor,
    kv: torch.Tensor,
    slots: list[torch.Tensor],
    attn_sink: torch.Tensor | None,
    scale: float,
    out_width: int,
) -> torch.Tensor:
    """q [T, H, 512] bf16, kv [N, 512] bf16 workspace -> [T, H, out_width] bf16."""
    kvf = kv.reshape(kv.shape[0], -1).float().cpu()
    sink = attn_sink[: q.shape[1]].cpu() if attn_sink is not None else None
    out = torch.zeros(q.shape[0], q.shape[1], kvf.shape[1])
    for t in range(q.shape[0]):
        out[t] = attend(q[t].float().cpu(), kvf[slots[t]], sink, scale)
    return out[..., :out_width].bfloat16()
