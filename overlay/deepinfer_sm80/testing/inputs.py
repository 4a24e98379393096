"""Input builders shared by tests and benches: stable seeds, K rows, fp8_ds_mla page pools, block tables.

Every random draw comes from `generator(name)`, seeded by crc32 of a case name, so a failure reproduces
in any process; `seed_note(name)` is the text a failure message carries.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from deepinfer_sm80.formats.fp8_ds_mla import (
    GROUP,
    HEAD_DIM,
    N_GROUPS,
    NOPE_DIM,
    RECORD_BYTES,
    ROPE_DIM,
    page_bytes,
    token_views,
)

# UE8M0 bytes outside the encoders' 105..247 (SPEC: 0 and 255 mean unwritten or corrupt pages)
EDGE_SCALES = (0, 1, 126, 127, 128, 254, 255)
ENCODER_SCALES = (105, 248)  # [low, high) of the exponents V4.1's writers produce


def case_seed(name: str) -> int:
    """Stable across processes and Python versions (unlike hash(), which is salted per process)."""
    return zlib.crc32(name.encode())


def generator(name: str, device: str | torch.device = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(case_seed(name))


def seed_note(name: str) -> str:
    return f"case {name!r} seed {case_seed(name)} (crc32 of the name)"


def _draw_device(gen: torch.Generator | None) -> torch.device:
    return gen.device if gen is not None else torch.device("cpu")


# ----------------------------------------------------------------------------- K rows
def k_rows(
    tokens: int,
    gen: torch.Generator,
    *,
    device: str | torch.device = "cpu",
    row_stride: int = HEAD_DIM,
    extra_rows: int = 0,
    rope_bits: bool = True,
) -> torch.Tensor:
    """[tokens + extra_rows, 512] bf16 K rows (a strided view when row_stride > 512).

    NoPE groups spread over 2^±40, with zero, bf16-subnormal and near-max groups. `rope_bits`: the RoPE
    tail is random bit patterns plus a NaN payload, -inf and -0 (for bitwise tests); otherwise normal
    values (for timing).
    """
    n, on = tokens + extra_rows, _draw_device(gen)
    x = torch.randn(n, N_GROUPS + 1, GROUP, generator=gen, device=on)
    x = x * torch.exp2(torch.randint(-40, 40, (n, N_GROUPS + 1, 1), generator=gen, device=on).float())
    kind = torch.randint(0, 16, (n, N_GROUPS + 1, 1), generator=gen, device=on)
    x = torch.where(kind == 0, torch.zeros_like(x), x)  # the writers' amax floor 1e-4
    x = torch.where(kind == 1, x * 2.0**-126, x)  # bf16 subnormals
    x = torch.where(kind == 2, x.sign() * 3.3e38 * torch.rand(x.shape, generator=gen, device=on), x)
    if rope_bits:
        rows = torch.randint(-(2**15), 2**15, (n, row_stride), dtype=torch.int16, generator=gen, device=on)
        rows[:, 448] = 0x7FC1  # a NaN with payload
        rows[:, 449] = torch.tensor(float("-inf")).bfloat16().view(torch.int16)
        rows[:, 450] = torch.tensor(-0.0).bfloat16().view(torch.int16)
    else:
        rows = torch.randn(n, row_stride, generator=gen, device=on).bfloat16().view(torch.int16)
    rows[:, :NOPE_DIM] = x.reshape(n, -1)[:, :NOPE_DIM].bfloat16().view(torch.int16)
    return rows.to(device).view(torch.bfloat16)[:, :HEAD_DIM]  # slice after the move: .to() would pack


def avoid_seven_pow2(k: torch.Tensor) -> torch.Tensor:
    """Nudge NoPE groups whose amax is 7·2^j one bf16 ulp up (sign kept).

    There `amax·fl32(1/448)` is an exact power of two and a float `ceil(log2(amax/448))` may pick either
    exponent (docs/FP8_DS_MLA.md); the exact rule is tested separately.
    """
    bits = k.view(torch.int16).clone()
    nope = bits[:, :NOPE_DIM].clone().reshape(-1, N_GROUPS, GROUP)
    mag = nope & 0x7FFF
    at_max = mag == mag.amax(-1, keepdim=True)
    seven = ((mag & 0x7F) == 0x60) & (mag >= 0x0080) & (mag < 0x7F80) & at_max
    nope += seven.to(torch.int16)
    bits[:, :NOPE_DIM] = nope.reshape(-1, NOPE_DIM)
    return bits.view(torch.bfloat16)


# ----------------------------------------------------------------------------- paged fp8_ds_mla caches
def scale_bytes(shape: tuple[int, ...], gen: torch.Generator, *, with_zero: bool = True) -> torch.Tensor:
    """UE8M0 bytes: mostly the encoders' 105..247, a fifth from EDGE_SCALES."""
    on = _draw_device(gen)
    edges = torch.tensor([s for s in EDGE_SCALES if with_zero or s != 0], dtype=torch.uint8, device=on)
    normal = torch.randint(*ENCODER_SCALES, shape, generator=gen, dtype=torch.uint8, device=on)
    edge = edges[torch.randint(0, len(edges), shape, generator=gen, device=on)]
    return torch.where(torch.rand(shape, generator=gen, device=on) < 0.2, edge, normal)


def page_pool(
    num_blocks: int,
    block_size: int,
    gen: torch.Generator,
    *,
    device: str | torch.device = "cpu",
    valid: bool,
    layers_per_block: int = 1,
) -> torch.Tensor:
    """[num_blocks, block_size, 584] uint8 view of random pages (the last layer's when layers share blocks).

    `valid`: encoder-like records (finite codes, scales 105..247, pad 0, normal RoPE) as serving sees them;
    otherwise every data byte pattern appears, a fifth of the scales are edge bytes and the RoPE halves
    carry NaN, ±inf and -0.
    """
    on, page = _draw_device(gen), page_bytes(block_size)
    raw = torch.randint(
        0, 256, (num_blocks, layers_per_block * page), dtype=torch.uint8, generator=gen, device=on
    )
    view = raw.as_strided(
        (num_blocks, block_size, RECORD_BYTES),
        (raw.stride(0), RECORD_BYTES, 1),
        (layers_per_block - 1) * page,
    )
    data, scale = token_views(view, block_size)
    if valid:
        nope = data[..., :NOPE_DIM]
        nope[(nope & 0x7F) == 0x7F] = 0x7E
        rope = torch.randn(num_blocks, block_size, ROPE_DIM, generator=gen, device=on).bfloat16()
        data[..., NOPE_DIM:] = rope.view(torch.uint8).view(num_blocks, block_size, 2 * ROPE_DIM)
        scale[..., :N_GROUPS] = torch.randint(
            *ENCODER_SCALES, (num_blocks, block_size, N_GROUPS), dtype=torch.uint8, generator=gen, device=on
        )
        scale[..., N_GROUPS] = 0
    else:
        scale[..., :N_GROUPS] = scale_bytes((num_blocks, block_size, N_GROUPS), gen)
        rope = data[..., NOPE_DIM:].view(torch.int16)
        for col, value in enumerate((float("nan"), float("inf"), float("-inf"), -0.0)):
            rope[:, ::3, col] = torch.tensor(value, dtype=torch.bfloat16).view(torch.int16)
    return view.to(device) if view.device != torch.device(device) else view


def block_table(
    lens: list[int],
    num_blocks: int,
    block_size: int,
    gen: torch.Generator,
    *,
    device: str | torch.device = "cpu",
    pad: int = 0,
    fill: int = -1,
    dtype: torch.dtype = torch.int32,
) -> torch.Tensor:
    """[R, width] distinct random blocks per request; `pad` > 0 returns a column slice of a wider table
    (row stride ≠ width), unused entries are `fill`."""
    needed = [-(-n // block_size) for n in lens]
    if sum(needed) > num_blocks:
        raise ValueError(f"{sum(needed)} blocks needed, pool has {num_blocks}")
    perm = torch.randperm(num_blocks, generator=gen, device=_draw_device(gen)).to("cpu")
    width = max(max(needed, default=0), 1)
    table = torch.full((len(lens), width + 2 * pad), fill, dtype=dtype)
    start = 0
    for r, nb in enumerate(needed):
        table[r, pad : pad + nb] = perm[start : start + nb].to(dtype)
        start += nb
    return table.to(device)[:, pad : pad + width]


# ----------------------------------------------------------------------------- TopK + SWA combiner
@dataclass(frozen=True)
class CombineInputs:
    topk_indices: torch.Tensor  # [T, topk] int32, request-local compressed positions, -1 padded
    query_start_loc: torch.Tensor  # [R + 1] int32
    seq_lens: torch.Tensor  # [R] int32
    gather_lens: torch.Tensor  # [R] int32
    window_size: int
    compress_ratio: int
    topk: int
    M: int
    N: int


def random_combine_inputs(
    query_lens: list[int],
    prefix_lens: list[int],
    *,
    compress_ratio: int,
    topk: int = 512,
    window_size: int = 128,
    device: str | torch.device,
    generator: torch.Generator | None = None,
) -> CombineInputs:
    """One prefill chunk: request b has prefix_lens[b] cached and query_lens[b] new tokens; never all -1."""
    seq = [p + q for p, q in zip(prefix_lens, query_lens, strict=True)]
    gather = [min(s, q + window_size - 1) for s, q in zip(seq, query_lens, strict=True)]
    n_comp = max((s // compress_ratio) if compress_ratio else 0 for s in seq)
    M = n_comp + max(gather)
    T = sum(query_lens)
    rows = []
    for p, q in zip(prefix_lens, query_lens, strict=True):
        pos = torch.arange(p, p + q)
        valid = (pos + 1) // compress_ratio if compress_ratio else torch.zeros_like(pos)
        width = max(topk, 1)
        raw = (torch.rand(q, width, generator=generator) * valid.clamp(min=1)[:, None]).to(torch.int32)
        raw[torch.arange(width)[None, :] >= valid[:, None]] = -1
        rows.append(raw[:, :topk])
    topk_indices = torch.cat(rows) if rows else torch.empty(0, topk, dtype=torch.int32)
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    assert topk_indices.shape == (T, topk)
    return CombineInputs(
        topk_indices=topk_indices.to(device),
        query_start_loc=qsl.to(device),
        seq_lens=torch.tensor(seq, dtype=torch.int32, device=device),
        gather_lens=torch.tensor(gather, dtype=torch.int32, device=device),
        window_size=window_size,
        compress_ratio=compress_ratio,
        topk=topk,
        M=M,
        N=n_comp,
    )


# ----------------------------------------------------------------------------- DSpark draft step
DRAFT_KINDS = ("random", "ties", "all-equal", "nan-rows", "neg-inf-bias", "temp0-and-padding")


@dataclass(frozen=True)
class DraftInputs:
    """One DSpark draft block: K positions of base logits plus the Markov head and sampling state."""

    base_logits: torch.Tensor  # [B, K, V] bf16
    bias: torch.Tensor  # [B, K, V] bf16, a per-position bias for step-level tests
    anchor: torch.Tensor  # [B] int64
    markov_w1: torch.Tensor  # [V, R] bf16
    markov_w2: torch.Tensor  # [V, R] bf16
    idx_map: torch.Tensor  # [B, K] int64 request slot (-1 = padding row)
    sample_pos: torch.Tensor  # [B, K] int64 predicted-token position
    temperature: torch.Tensor  # [slots] fp32
    seeds: torch.Tensor  # [slots] int64


def draft_inputs(
    kind: str,
    B: int,
    K: int,
    V: int,
    R: int,
    gen: torch.Generator,
    *,
    device: str | torch.device = "cpu",
    exact_markov: bool = False,
) -> DraftInputs:
    """Logits of `kind` (DRAFT_KINDS): exact ties, constant rows, NaN rows, -inf biases, T = 0 / padding.

    Drawn on the generator's device (a CUDA generator keeps the 66 MB Markov head off the host).
    `exact_markov`: Markov weights on a coarse grid (multiples of 2^-2 and 2^-7, |bias| < 2^6) so every
    bias sum is exact in fp32 and any summation order gives the same bf16 bias.
    """
    if kind not in DRAFT_KINDS:
        raise ValueError(f"draft input kind {kind!r} not in {DRAFT_KINDS}")
    slots = B + 3
    g = _draw_device(gen)
    base = torch.randn(B, K, V, generator=gen, device=g) * 3
    bias = torch.randn(B, K, V, generator=gen, device=g)
    if kind == "ties":  # a handful of values: many exact maxima per row, spread over blocks
        base = torch.randint(0, 4, (B, K, V), generator=gen, device=g).float()
        bias = torch.zeros(B, K, V, device=g)
    elif kind == "all-equal":
        base = torch.full((B, K, V), 1.5, device=g)
        bias = torch.zeros(B, K, V, device=g)
    elif kind == "nan-rows":  # row 0 all NaN, odd rows a few NaNs, the rest clean
        base[0] = float("nan")
        pick = torch.rand(B, K, V, generator=gen, device=g) < 0.002
        pick[0::2] = False
        base[pick] = float("nan")
    elif kind == "neg-inf-bias":  # -inf over most columns, one row entirely -inf
        bias[torch.rand(B, K, V, generator=gen, device=g) < 0.9] = float("-inf")
        bias[-1] = float("-inf")
    temperature = torch.rand(slots, generator=gen, device=g) * 1.5 + 0.1
    idx_map = torch.randperm(slots, generator=gen, device=g)[:B][:, None].expand(B, K).clone()  # [B, K]
    if kind == "temp0-and-padding":
        temperature[idx_map[0::3, 0]] = 0.0
        idx_map[1::4] = -1
    seeds = torch.randint(-(1 << 62), 1 << 62, (slots,), generator=gen, device=g)
    start = torch.randint(0, 5000, (B, 1), generator=gen, device=g)
    sample_pos = start + torch.arange(K, device=g)[None, :] + 1  # [B, K]
    w1 = torch.randn(V, R, generator=gen, device=g) * 0.5
    w2 = torch.randn(V, R, generator=gen, device=g) * 0.05
    if exact_markov:
        w1 = torch.randint(-4, 5, (V, R), generator=gen, device=g) * 0.25
        w2 = torch.randint(-8, 9, (V, R), generator=gen, device=g) * 2.0**-7
    bf = torch.bfloat16
    return DraftInputs(
        base_logits=base.to(bf).to(device), bias=bias.to(bf).to(device),
        anchor=torch.randint(0, V, (B,), generator=gen, device=g).to(device), markov_w1=w1.to(bf).to(device),
        markov_w2=w2.to(bf).to(device), idx_map=idx_map.to(device), sample_pos=sample_pos.to(device),
        temperature=temperature.to(device), seeds=seeds.to(device),
    )  # fmt: skip
