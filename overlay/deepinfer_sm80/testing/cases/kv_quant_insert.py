"""Cases of the KV insert (row `kv_quant_insert`, ops/kv_quant_insert.py): the named interpreter cases its
test runs base and optimized over (and their input builder), the entry-point A/B prefill shapes, and the
bitwise cases against upstream's kernel (sm_89+) that bench/kv_quant_insert.py records in its JSON and
tests/ops/test_kv_quant_insert.py asserts.

Equality contract: bitwise on the whole page pool (`pool_of`: other layers' pages and page padding
included), so a stray or missing write anywhere shows; base only off amax = 7·2^j groups, whose float
exponent may round either way (`avoid_seven_pow2`, docs/FP8_DS_MLA.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from deepinfer_sm80.testing import kv_cache_shapes as kc
from deepinfer_sm80.testing.cases.entry_point import Shape, bitwise
from deepinfer_sm80.testing.cases.upstream_records import bitwise_record, clone_view, pool_of


@dataclass(frozen=True)
class Case:
    name: str  # the seed
    tokens: int
    block_size: int = 32  # SWA pages; compressed pages hold 128 or 64 states (docs/FP8_DS_MLA.md)
    num_blocks: int = 6
    skipped: int = 0  # slots set to -1
    slot_dtype: torch.dtype = torch.int64
    extra_rows: int = 0  # k rows past the last slot (DP padding: slot_mapping is shorter than k)
    k_row_stride: int = 512
    layers_per_block: int = 1


CASES = [
    Case("single-token", 1),
    Case("decode-64", 64, block_size=64, num_blocks=2),
    Case("odd-T37", 37, skipped=5),  # a tail for either launch tile
    Case("int32-slots", 50, slot_dtype=torch.int32, skipped=3),
    Case("bs128", 90, block_size=128, num_blocks=2),
    Case("padded-k", 20, extra_rows=7, skipped=20),
    Case("strided-k", 9, k_row_stride=640),
    Case("shared-block", 30, layers_per_block=3),
]
TILE_CASE = CASES[2]  # odd-T37: both launch tiles must write the same bytes


def insert_inputs(
    case: Case, device: str, seed: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(k, slots, cache) on `device`, drawn on the CPU from crc32(case.name) unless a (hypothesis) seed is
    given."""
    from deepinfer_sm80.formats.fp8_ds_mla import make_k_cache
    from deepinfer_sm80.testing.inputs import generator, k_rows

    gen = generator(case.name) if seed is None else torch.Generator().manual_seed(seed)
    k = k_rows(case.tokens, gen, device=device, row_stride=case.k_row_stride, extra_rows=case.extra_rows)
    slots = torch.randperm(case.num_blocks * case.block_size, generator=gen)[: case.tokens]
    slots[torch.randperm(case.tokens, generator=gen)[: case.skipped]] = -1
    cache = make_k_cache(
        case.num_blocks,
        case.block_size,
        layers_per_block=case.layers_per_block,
        layer=case.layers_per_block - 1,
        device=device,
        generator=gen,
    )
    return k, slots.to(case.slot_dtype).to(device), cache


def upstream_insert(
    cu: Any, k: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor, block_size: int
) -> None:
    """Upstream's `quantize_and_insert_k_cache` (module `cu`); it indexes k rows by 512 (no stride
    argument), so it gets the same rows packed."""
    cu.quantize_and_insert_k_cache(k.contiguous(), cache, slots, block_size=block_size)


# (tokens, block size, slot dtype): one token, int32 slots, a prefill chunk, the largest insert timed
UPSTREAM_CASES = ((1, 32, "int64"), (37, 32, "int32"), (1536, 128, "int64"), (8192, 64, "int64"))


def entry_point_shapes(quick: bool) -> Iterator[Shape]:
    from deepinfer_sm80.testing.bench import input_sets_needed
    from deepinfer_sm80.testing.inputs import avoid_seven_pow2, generator

    # amax = 7·2^j groups may round to either exponent (docs/FP8_DS_MLA.md): nudged, as the bench does
    for tokens in (64,) if quick else (1, 64, 1_536, 8_192):
        bs, n_bytes = kc.INSERT_BLOCK_SIZE, tokens * kc.INSERT_BYTES_PER_TOKEN
        n_sets = input_sets_needed(n_bytes)

        def make(tokens: int = tokens, bs: int = bs, n_sets: int = n_sets) -> Callable[..., Any]:
            gen = generator(f"ab-kv-insert-{tokens}", "cuda")
            blocks = -(-tokens // bs) + 2
            sets = [
                (avoid_seven_pow2(kc.random_k(tokens, gen)), kc.random_pool(blocks, bs, gen, valid=True),
                 kc.prefill_slots(tokens, blocks, bs, gen))
                for _ in range(n_sets)
            ]  # fmt: skip
            pools = {}

            def run(fn: Callable[..., Any], i: int) -> Any:
                k, pool, slots = sets[i]
                if (id(fn), i) not in pools:  # per-level copies, made before capture (never inside it)
                    pools[(id(fn), i)] = pool.clone()
                target = pools[(id(fn), i)]
                fn(k, target, slots, bs)
                return target

            return run

        yield Shape(f"prefill-T{tokens}", tokens, n_bytes, make, n_sets, bitwise)


def upstream_bitwise(cu: Any, gen: Any) -> dict[str, object]:
    """Base, optimized and the torch reference vs upstream's `quantize_and_insert_k_cache` (module `cu`) on
    the whole pool: random slots with a seventh skipped (-1), RoPE columns of any bits (NaN/inf/-0)."""
    from deepinfer_sm80.ops import kv_quant_insert as kvi
    from deepinfer_sm80.testing.inputs import avoid_seven_pow2, k_rows, page_pool

    out: dict[str, object] = {}
    for tokens, bs, slot_dtype in UPSTREAM_CASES:
        num_blocks = -(-tokens // bs) * 2 + 1
        cache = page_pool(num_blocks, bs, gen, device="cuda", valid=False)
        k = avoid_seven_pow2(k_rows(tokens, gen, device="cuda", rope_bits=False))
        k[:, 448:] = torch.randint(
            -(2**15), 2**15, (tokens, 64), dtype=torch.int16, device="cuda", generator=gen
        ).view(torch.bfloat16)  # RoPE: any bits, NaN/inf/-0 included
        slots = torch.randperm(num_blocks * bs, device="cuda", generator=gen)[:tokens]
        slots[torch.randperm(tokens, device="cuda", generator=gen)[: tokens // 7]] = -1
        slots = slots.to(getattr(torch, slot_dtype))
        caches = {name: clone_view(cache) for name in ("upstream", "base", "optimized", "reference")}
        cu.quantize_and_insert_k_cache(k, caches["upstream"], slots.long(), block_size=bs)
        kvi.base_quantize_and_insert_k_cache(k, caches["base"], slots, bs)
        kvi.quantize_and_insert_k_cache(k, caches["optimized"], slots, bs)
        kvi.quantize_and_insert_ref(k, caches["reference"], slots, bs)
        want = pool_of(caches["upstream"])
        out[f"T{tokens}-bs{bs}-{slot_dtype}"] = {
            name: bitwise_record(f"insert {name} T={tokens}", pool_of(caches[name]), want)
            for name in ("base", "optimized", "reference")
        }
    out["amax_7x2^j"] = seven_pow2_probe(cu, gen)
    return out


def seven_pow2_probe(cu: Any, gen: Any) -> dict[str, object]:
    """Which exponent upstream's `ceil(log2(amax / 448))` picks when amax = 7·2^j exactly, beside ours."""
    from deepinfer_sm80.formats.fp8_ds_mla import token_views
    from deepinfer_sm80.ops import kv_quant_insert as kvi
    from deepinfer_sm80.testing.inputs import page_pool

    j = torch.arange(-13, 100, device="cuda")
    tokens = len(j)
    x = torch.randn(tokens, 512, device="cuda", generator=gen).clamp(-6.9, 6.9)
    x[:, :448] *= torch.exp2(j.float())[:, None]
    x[:, 0:448:64] = 7.0 * torch.exp2(j.float())[:, None]
    k = x.bfloat16()
    cache = page_pool(2, 128, gen, device="cuda", valid=False)
    slots = torch.arange(tokens, device="cuda")
    runs = {n: clone_view(cache) for n in ("upstream", "base", "optimized")}
    cu.quantize_and_insert_k_cache(k, runs["upstream"], slots, block_size=128)
    kvi.base_quantize_and_insert_k_cache(k, runs["base"], slots, 128)
    kvi.quantize_and_insert_k_cache(k, runs["optimized"], slots, 128)
    exact = (j - 6 + 127).tolist()
    picked = {n: token_views(c, 128)[1][0, :tokens, :7].long() for n, c in runs.items()}
    result: dict[str, object] = {"groups": tokens * 7}
    for n, s in picked.items():
        lower = int((s == torch.tensor(exact, device="cuda")[:, None]).sum())
        result[n] = {
            "exact_lower_exponent": lower,
            "upper_exponent": int((s == torch.tensor(exact, device="cuda")[:, None] + 1).sum()),
        }
    result["base_vs_upstream"] = bitwise_record(
        "7·2^j base", pool_of(runs["base"]), pool_of(runs["upstream"])
    )
    result["optimized_vs_upstream"] = bitwise_record(
        "7·2^j optimized", pool_of(runs["optimized"]), pool_of(runs["upstream"])
    )
    print(f"amax=7·2^j probe: {result}")
    return result


ENTRY_POINT_CASES = {"kv_quant_insert": entry_point_shapes}
