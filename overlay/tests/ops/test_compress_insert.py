"""Compressed-KV writer (584-byte record): the SM80 kernel vs the exact torch reference, bitwise, over
the whole page pool; on a GPU of capability >= 8.9 also vs upstream's own `_rope_quant_insert_kernel`
(hardware e4m3) through upstream's dispatcher, bitwise."""

from __future__ import annotations

import pytest
import torch

from deepinfer_sm80.formats.fp8_ds_mla import RECORD_BYTES, make_k_cache
from deepinfer_sm80.ops import compress_insert as ci
from deepinfer_sm80.testing.cases.compress_insert import CASES, UPSTREAM_CASES, Case, make_inputs
from deepinfer_sm80.testing.compare import assert_bitwise_equal
from deepinfer_sm80.testing.gates import requires_sm, test_device
from deepinfer_sm80.testing.inputs import generator, seed_note

DEV = test_device()
# scripts/h200_final.sh phase 2 runs this module under compute-sanitizer, in this order (time-boxed)
H200_SANITIZE_ORDER = 5


def _as_view(pool: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return pool.as_strided(like.shape, like.stride(), like.storage_offset())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernel_matches_reference_bitwise(case: Case) -> None:
    latent, positions, cos_sin, slots, cache = make_inputs(case, DEV)
    pool_out = cache.untyped_storage()
    ref_cache = cache.cpu().clone() if cache.is_contiguous() else None
    # compare whole pools: clone the backing storage so stray writes into other layers' pages show
    base = torch.empty(0, dtype=torch.uint8, device=cache.device).set_(pool_out)
    ref_base = base.cpu().clone()
    ref_view = _as_view(ref_base, cache)
    ci.rope_quant_insert_ref(
        latent.cpu(), positions.cpu(), cos_sin.cpu(), ref_view, slots.cpu(), case.ratio, case.sanitize
    )
    ci.rope_quant_insert(latent, positions, cos_sin, cache, slots, case.ratio, case.sanitize)
    del ref_cache
    try:
        assert_bitwise_equal(case.name, base.cpu(), ref_base)
    except AssertionError as exc:
        raise AssertionError(f"{exc} [{seed_note(case.name)}]") from None


def test_exponent_at_seven_powers_of_two_is_exact() -> None:
    """amax = 7·2^k makes amax·fl32(1/448) an exact power of two: e must be k - 6 (not k - 5)."""
    latent = torch.zeros(4, 512, dtype=torch.bfloat16)
    for t, k in enumerate((-3, 0, 5, 20)):
        latent[t, :448] = 0.5 * 2.0**k
        latent[t, 0] = 7 * 2.0**k
    cache = make_k_cache(1, 128, generator=generator("seven-pow2"))
    slots, positions = torch.arange(4), torch.arange(4)
    cos_sin = torch.ones(8, 64)
    ci.rope_quant_insert(
        latent.to(DEV), positions.to(DEV), cos_sin.to(DEV), cache_dev := cache.to(DEV), slots.to(DEV), 1
    )
    scale_bytes = cache_dev.cpu().view(-1)[128 * 576 : 128 * 576 + 4 * 8].view(4, 8)
    for t, k in enumerate((-3, 0, 5, 20)):
        # group 0 holds 7·2^k: e = k - 6; the others' amax 2^(k-1) gives ceil(k - 1 - log2 448) = k - 9
        assert scale_bytes[t, :7].tolist() == [127 + k - 6] + [127 + k - 9] * 6, (
            t,
            k,
            scale_bytes[t].tolist(),
        )
        assert scale_bytes[t, 7] == 0


def test_bad_input_is_one_line_error() -> None:
    latent, positions, cos_sin, slots, cache = make_inputs(CASES[0], "cpu")
    with pytest.raises(ValueError, match="compress_ratio"):
        ci.rope_quant_insert(latent, positions, cos_sin, cache, slots, 4)
    with pytest.raises(ValueError, match="latent"):
        ci.rope_quant_insert(latent.float(), positions, cos_sin, cache, slots, 1)
    with pytest.raises(ValueError, match=str(RECORD_BYTES)):
        ci.rope_quant_insert(latent, positions, cos_sin, cache[..., :528], slots, 1)


# UPSTREAM_CASES leaves the sanitize case out (upstream's CUDA dispatcher never sets its gfx950-only
# SANITIZE_CACHE_NANS); the sanitize path is proven against the reference above.


@requires_sm(8, 9)
@pytest.mark.parametrize("case", UPSTREAM_CASES, ids=lambda c: c.name)
def test_matches_upstream_hardware_fp8_bitwise(case: Case) -> None:
    """Upstream's dispatcher with its own fp8 kernel vs the same dispatcher with ours swapped in."""
    fcq = pytest.importorskip("vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache")
    from deepinfer_sm80.bindings import original

    upstream_kernel = original(fcq.__name__, "_rope_quant_insert_kernel") or fcq._rope_quant_insert_kernel
    assert upstream_kernel is not ci.rope_quant_insert_kernel
    latent, positions, cos_sin, slots, cache = make_inputs(case, "cuda")
    theirs, ours = cache.clone(), cache.clone()
    saved = fcq._rope_quant_insert_kernel
    try:
        fcq._rope_quant_insert_kernel = upstream_kernel
        fcq.rope_quant_insert(latent, positions, cos_sin, theirs, slots, case.ratio)
        fcq._rope_quant_insert_kernel = ci.rope_quant_insert_kernel
        fcq.rope_quant_insert(latent, positions, cos_sin, ours, slots, case.ratio)
    finally:
        fcq._rope_quant_insert_kernel = saved
    torch.cuda.synchronize()
    assert_bitwise_equal(case.name, ours.view(-1), theirs.view(-1))
