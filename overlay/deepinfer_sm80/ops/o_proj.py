"""wo_a of the attention output projection on SM80/SM86: a bf16 copy made before Marlin's repack.

On SM8x vLLM 0.32.0 gives the FP8 block-scaled `wo_a` to Marlin (W8A16), whose
`process_weights_after_loading` replaces the weight with an int32 Marlin tensor; the o_proj then needs
either DeepGEMM's `fp8_einsum` (SM90+) or a bf16 `torch.bmm` on that int32 tensor (wrong dtype). Here
the weight is dequantized once at load time instead of being repacked (block scale x e4m3 value, exact
in fp32, then rounded to bf16 -- the weight upstream's own bf16 branch multiplies by), and the grouped
projection is a bf16 `torch.bmm` with fp32 accumulation.

Memory per rank and layer: `G_local x 1024 x 4096` bf16 = 2 B per weight instead of Marlin's 1 B (+
scales); `wo_a_bytes(tp)` gives the totals (docs/BLOCKERS.md lists them for TP2/4/8).

Proof against upstream: tests/integration/test_o_proj_upstream.py runs the whole front (inverse RoPE +
this bmm) against upstream's bf16 branch under the interpreter on every CI machine. A native-GPU twin
(upstream's `deep_gemm_fp8_o_proj` called on CUDA) was removed: it needs upstream's
`fused_inv_rope_fp8_quant` custom op registered for CUDA (a full vLLM build with `vllm._C`) and
capability >= 8.9, so it could not run on an Ampere node (8.0/8.6) nor on the lent H200 (no `vllm._C`),
and never passed anywhere (results/gpu/patches-h200.json records its failure).
"""

from __future__ import annotations

import torch

from deepinfer_sm80.formats.v41 import V41

E8M0 = getattr(torch, "float8_e8m0fnu", None)


def decode_scale(scale: torch.Tensor) -> torch.Tensor:
    """Block scales as fp32: UE8M0 bytes (float8_e8m0fnu or uint8) by exponent placement, else a cast."""
    if scale.dtype == torch.uint8 or (E8M0 is not None and scale.dtype == E8M0):
        return (scale.view(torch.uint8).to(torch.int32) << 23).view(torch.float32)
    return scale.float()


def dequant_block_fp8(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """weight [N, K] e4m3 (or its uint8 bytes), scale [N / bn, K / bk] -> bf16 [N, K].

    The block shape follows from the two shapes (128x128 for V4.1's FP8 checkpoints, 32x32 / 1x32
    for MXFP8 exports). fp32 product of an e4m3 value and a power-of-two scale is exact; one rounding
    to bf16 (the same weight upstream's bf16 branch would hold).
    """
    if weight.dim() != 2 or scale.dim() != 2:
        raise ValueError(f"expected 2-D weight and scale, got {tuple(weight.shape)} and {tuple(scale.shape)}")
    n, k = weight.shape
    if n % scale.shape[0] or k % scale.shape[1]:
        raise ValueError(f"scale {tuple(scale.shape)} does not tile weight {tuple(weight.shape)}")
    bn, bk = n // scale.shape[0], k // scale.shape[1]
    values = weight.view(torch.float8_e4m3fn).float()  # [N, K], exact
    s = decode_scale(scale).repeat_interleave(bn, 0).repeat_interleave(bk, 1)  # [N, K]
    return (values * s).to(torch.bfloat16)


def wo_a_bmm(o: torch.Tensor, wo_a: torch.Tensor, n_groups: int) -> torch.Tensor:
    """o [T, H, 512] bf16 (inverse-RoPE'd), wo_a [G * R, H / G * 512] bf16 -> z [T, G, R] bf16."""
    t = o.shape[0]
    x = o.reshape(t, n_groups, -1)  # [T, G, K]
    w = wo_a.view(n_groups, -1, x.shape[-1])  # [G, R, K]
    z = torch.empty((t, n_groups, w.shape[1]), dtype=torch.bfloat16, device=o.device)
    torch.bmm(x.transpose(0, 1), w.transpose(1, 2), out=z.transpose(0, 1))  # [G, T, R]
    return z


def wo_a_ref(o: torch.Tensor, wo_a: torch.Tensor, n_groups: int) -> torch.Tensor:
    """The spec: fp32 einsum of the same bf16 operands -> fp32 [T, G, R]."""
    x = o.float().reshape(o.shape[0], n_groups, -1)
    w = wo_a.float().view(n_groups, -1, x.shape[-1])
    return torch.einsum("tgk,grk->tgr", x, w)


def wo_a_bytes(tp: int, layers: int = V41.layers + V41.draft_layers) -> dict[str, int]:
    """Bytes of wo_a per rank: bf16 (ours) vs Marlin FP8 (1 B per weight + fp32 128x128 block scales)."""
    rank = V41.per_rank(tp)
    weights = rank.o_groups * V41.o_lora * V41.heads_per_o_group * V41.head_dim  # per layer
    marlin = weights + weights // (128 * 128) * 4
    return {
        "bf16_per_layer": 2 * weights,
        "marlin_per_layer": marlin,
        "layers": layers,
        "bf16_total": 2 * weights * layers,
        "extra_total": (2 * weights - marlin) * layers,
    }
