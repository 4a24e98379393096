"""mHC boundaries: the torch spec on its own, against upstream's torch references, the split selector,
the sm_80 cross-compile, and (on a GPU) our TileLang kernels against the spec and upstream's kernels.
Token counts, configs, the spec call, the argument lists and the contracts: testing/cases/mhc.py.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from deepinfer_sm80.ops.mhc import reference as ref
from deepinfer_sm80.ops.mhc import splits
from deepinfer_sm80.testing.cases.mhc import (
    GPU_TOKENS,
    HIDDEN,
    OTHER_HIDDEN,
    PATH_TOKENS,
    POST_TOKENS,
    SCALARS,
    SELECTOR_TOKENS,
    SINKHORN_TOKENS,
    SM_COUNTS,
    SMALL_H,
    SMALL_T_CONFIGS,
    SMALL_T_TOKENS,
    TC_TOKENS,
    TOL,
    UPSTREAM_FIRST_TOKENS,
    UPSTREAM_POST_TOKENS,
    UPSTREAM_TOKENS,
    UPSTREAM_TOL,
    UPSTREAM_WHY,
    V41_PARAMS,
    VARIANTS,
    WHY,
    bf16_close,
    boundary_inputs,
    fused_args,
    fused_kw,
    post_args,
    pre_call,
    spec,
)
from deepinfer_sm80.testing.compare import assert_bitwise_equal, assert_close
from deepinfer_sm80.testing.gates import requires_cuda
from deepinfer_sm80.testing.inputs import generator, seed_note
from deepinfer_sm80.testing.tilelang_compile import tilelang_missing_reason

P = V41_PARAMS
# scripts/h200_final.sh phase 2 runs this module under compute-sanitizer, in this order (time-boxed)
H200_SANITIZE_ORDER = 8
UPSTREAM_TORCH = importlib.util.find_spec("vllm") is not None


# ----------------------------------------------------------------------------- the reference on its own
@pytest.mark.parametrize("num_tokens", SINKHORN_TOKENS)
def test_sinkhorn_is_doubly_stochastic(num_tokens):
    name = f"sinkhorn-T{num_tokens}"
    logits = torch.randn(num_tokens, 4, 4, generator=generator(name))  # O(1), as the gates produce
    comb = ref.sinkhorn(logits, P.hc_sinkhorn_eps, P.sinkhorn_repeat)
    # the last step divides by (colsum + eps): columns are 1 within a few eps; 20 iterations bring
    # rows to 1 within 4e-5 on N(0,1) logits (1000 tokens: 3.7e-5 measured); more for peaked logits
    assert (comb.sum(-2) - 1).abs().max() < 4e-6, seed_note(name)
    assert (comb.sum(-1) - 1).abs().max() < 1e-4, seed_note(name)
    assert (comb > 0).all()
    c64 = ref.sinkhorn(logits.double(), P.hc_sinkhorn_eps, P.sinkhorn_repeat)
    assert_close("sinkhorn fp32 vs fp64", comb, c64.float(), abs=1e-6, rel_in_eps=64, why="fp32 rounding")


@pytest.mark.parametrize("fused", [True, False])
def test_float32_spec_agrees_with_float64(fused):
    name = f"f64-{fused}"
    inp = boundary_inputs(name, 6, SMALL_H)
    o32, o64 = spec(inp, fused=fused), spec(inp, fused=fused, dtype=torch.float64)
    why = "fp32 vs fp64 accumulation over 4H-term dot products and 20 Sinkhorn iterations"
    for field in ("post", "comb", "pre_mix"):
        assert_close(
            field, getattr(o32, field), getattr(o64, field).float(), abs=1e-6, rel_in_eps=64, why=why
        )
    # bf16 boundaries: identical bytes except where fp32 rounding crosses a bf16 midpoint
    for field in ("residual", "layer_input"):
        a, b = getattr(o32, field), getattr(o64, field)
        assert (a != b).float().mean() < 1e-3, f"{field}: {seed_note(name)}"


@pytest.mark.skipif(not UPSTREAM_TORCH, reason="vLLM 0.32.0 not installed")
def test_pre_matches_upstream_torch_reference():
    from vllm.model_executor.kernels.mhc.torch import mhc_pre_delayed_torch

    name = "upstream-torch-pre"
    inp = boundary_inputs(name, 5, SMALL_H)
    mine = spec(inp, fused=False, norm=False)
    post, comb, layer_input, pre = mhc_pre_delayed_torch(
        inp.residual, inp.fn, inp.hc_scale, inp.hc_base, *SCALARS, pre_mix=inp.pre_mix
    )
    assert_bitwise_equal("post", mine.post, post.squeeze(-1))
    assert_bitwise_equal("comb", mine.comb, comb)
    assert_bitwise_equal("pre_mix", mine.pre_mix, pre)
    assert_bitwise_equal("layer_input", mine.layer_input, layer_input)


@pytest.mark.skipif(not UPSTREAM_TORCH, reason="vLLM 0.32.0 not installed")
def test_post_map_matches_upstream_torch_reference():
    from vllm.model_executor.kernels.mhc.torch import mhc_post_torch

    inp = boundary_inputs("upstream-torch-post", 4, SMALL_H)
    theirs = mhc_post_torch(inp.x, inp.residual, inp.post.unsqueeze(-1), inp.comb)
    mine = ref.post_map(inp.x, inp.residual, inp.post, inp.comb).to(torch.bfloat16)
    # einsum sums k in another order: a few bf16 roundings differ by one ulp
    assert_close(
        "post_map",
        mine.float(),
        theirs.float(),
        abs=0,
        rel_in_eps=2 * 2**16,
        why="k order (fp32 ulp -> bf16)",
    )
    assert (mine != theirs).float().mean() < 1e-3


def test_first_layer_collapse_is_the_embedding():
    inp = boundary_inputs("first-layer", 3, SMALL_H)
    out = spec(inp, fused=False, first=True, norm=False)
    assert_bitwise_equal("layer_input", out.layer_input, inp.x)


def test_zero_rows_stay_finite():
    inp = boundary_inputs("zero-rows", 4, SMALL_H, zero_rows=2)
    out = spec(inp, fused=False)
    for field in ("post", "comb", "pre_mix", "layer_input"):
        assert getattr(out, field).float().isfinite().all(), field


def test_fn_hi_lo_split_keeps_the_projection_within_tolerance():
    """The tensor-core partials project the bf16 R' against bf16(fn) + bf16(fn - bf16(fn)); in exact
    arithmetic (float64 here) that must sit inside the GPU tests' fp32 tolerance of the spec."""
    inp = boundary_inputs("hi-lo", 16, SMALL_H)
    streams = inp.residual.reshape(16, -1).double()  # bf16 values, exact in float64
    hi = inp.fn.to(torch.bfloat16)
    lo = (inp.fn - hi.float()).to(torch.bfloat16)
    split = streams @ (hi.double() + lo.double()).t()
    exact = streams @ inp.fn.double().t()
    assert_close(
        "hi+lo projection", split.float(), exact.float(), **TOL, why="fn carried to ~2^-16 by hi + lo"
    )


# ----------------------------------------------------------------------------- split selector
@pytest.mark.parametrize("hidden", [HIDDEN, *OTHER_HIDDEN])
@pytest.mark.parametrize("sms", SM_COUNTS)
def test_split_is_aligned_and_fills_the_gpu(hidden, sms):
    for t in SELECTOR_TOKENS:
        cfg = splits.partials_config(t, hidden, sms)
        per_split = hidden // cfg.n_splits
        assert hidden % cfg.n_splits == 0 and per_split % cfg.columns_per_iteration() == 0, (t, cfg)
        ctas = -(-t // cfg.block_m) * cfg.n_splits
        assert ctas <= splits.CTAS_PER_SM * sms or cfg.n_splits == 1, (t, cfg)


def test_tensor_core_split_is_aligned():
    for hidden in (HIDDEN, *OTHER_HIDDEN):
        for t in TC_TOKENS:
            cfg = splits.partials_config(t, hidden, 108, tensor_cores=True)
            assert cfg.tc and (hidden // cfg.n_splits) % splits.TC_COLUMNS == 0, (hidden, t, cfg)
    assert not splits.partials_config(splits.TC_MIN_TOKENS - 1, HIDDEN, 108, tensor_cores=True).tc


def test_split_at_5120_uses_5x128_columns_at_one_token():
    cfg = splits.partials_config(1, HIDDEN, 108)
    assert (cfg.n_splits, HIDDEN // cfg.n_splits) == (40, 128)


@pytest.mark.parametrize("tc", [False, True])
def test_warmup_list_covers_every_selection(tc):
    configs = set(splits.configs_for_server(2048, HIDDEN, 108, tc))
    assert {splits.partials_config(t, HIDDEN, 108, tc) for t in range(1, 2049)} == configs


@pytest.mark.parametrize("bad", [dict(num_tokens=0), dict(hidden=5000), dict(sm_count=0)])
def test_selector_refuses_bad_input(bad):
    args = dict(num_tokens=4, hidden=HIDDEN, sm_count=108) | bad
    with pytest.raises(ValueError):
        splits.partials_config(**args)


# ----------------------------------------------------------------------------- cross-compile
@pytest.mark.skipif(tilelang_missing_reason() is not None, reason=str(tilelang_missing_reason()))
@pytest.mark.parametrize(
    "which",
    [
        "mhc_partials post+pre h5120 T1 ",
        "mhc_partials_tc post+pre h5120 T1536",
        "upstream mhc_fused_tilelang tile_n2",
    ],
)
def test_compiles_for_sm80_within_budget(which):
    # in a fresh interpreter: vLLM's model code imported earlier in a session builds upstream's TileLang
    # kernels with vllm.tilelang_utils.T unbound (CPU), and which test imports it first is order-dependent
    script = (
        "import sys\n"
        "from deepinfer_sm80.ops.mhc import TILELANG_SPECS\n"
        "from deepinfer_sm80.testing.tilelang_compile import compile_tilelang\n"
        "spec = next(s for s in TILELANG_SPECS if s.name.startswith(sys.argv[1]))\n"
        "r = compile_tilelang(spec, 80)\n"
        "print('REPORT', r.regs, r.problems)\n"
        "sys.exit(0 if r.regs > 0 and not r.problems else 1)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", script, which], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]


# ------------------------------------------------------------------------- GPU: kernels vs spec and upstream
@requires_cuda
@pytest.mark.parametrize("num_tokens", GPU_TOKENS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_kernels_match_spec(num_tokens, variant):
    from deepinfer_sm80.ops.mhc import boundary as bd

    name = f"gpu-{variant}-T{num_tokens}"
    inp = boundary_inputs(name, num_tokens, HIDDEN).to("cuda")
    fused = variant.startswith("fused") or variant == "no-norm"
    want = spec(
        inp, fused=fused, first=variant == "first", norm=variant != "no-norm", aux=variant == "fused-aux"
    )
    if fused:
        res, post, comb, li, pre, aux = bd.mhc_fused_post_pre_delayed_tilelang(
            *fused_args(inp), **fused_kw(inp, norm=variant != "no-norm"), capture_aux=variant == "fused-aux"
        )
        # nvcc contracts post*x + comb*R into FMAs, torch rounds each product: 1-ulp bf16 flips
        bf16_close(f"R' {seed_note(name)}", res, want.residual)
        if variant == "fused-aux":
            bf16_close("aux", aux, want.aux)
    else:
        args, kw = pre_call(inp, first=variant == "first")
        post, comb, li, pre = bd.mhc_pre_delayed_tilelang(*args, **kw)
    assert_close("post", post.squeeze(-1), want.post, **TOL, why=WHY)
    assert_close("comb", comb, want.comb, **TOL, why=WHY)
    assert_close("pre_mix", pre, want.pre_mix, **TOL, why=WHY)
    bf16_close(f"layer_input {seed_note(name)}", li, want.layer_input)


@requires_cuda
@pytest.mark.parametrize("num_tokens", SMALL_T_TOKENS)
@pytest.mark.parametrize("cfg", SMALL_T_CONFIGS, ids=str)
def test_fused_small_t_configs(num_tokens, cfg):
    from deepinfer_sm80.ops.mhc import boundary as bd

    name = f"gpu-cfg-T{num_tokens}"
    inp = boundary_inputs(name, num_tokens, HIDDEN).to("cuda")
    want = spec(inp, fused=True, aux=True)
    res, post, comb, li, pre, aux = bd.fused_post_pre_with_config(
        cfg, *fused_args(inp), **fused_kw(inp), capture_aux=True
    )
    bf16_close(f"R' {seed_note(name)}", res, want.residual)
    bf16_close("aux", aux, want.aux)
    assert_close("post", post.squeeze(-1), want.post, **TOL, why=WHY)
    assert_close("comb", comb, want.comb, **TOL, why=WHY)
    assert_close("pre_mix", pre, want.pre_mix, **TOL, why=WHY)
    bf16_close(f"layer_input {seed_note(name)}", li, want.layer_input)


@requires_cuda
@pytest.mark.parametrize("tc", [False, True])
@pytest.mark.parametrize("num_tokens", PATH_TOKENS)
def test_fused_both_paths_at_many_tokens(num_tokens, tc):
    """The selector picks tensor cores here; the CUDA-core partials must agree at the same T."""
    from deepinfer_sm80.ops.mhc import boundary as bd

    name = f"gpu-paths-T{num_tokens}"
    inp = boundary_inputs(name, num_tokens, HIDDEN).to("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfg = splits.partials_config(num_tokens, HIDDEN, sms, tensor_cores=tc)
    assert cfg.tc == tc
    want = spec(inp, fused=True)
    res, post, comb, li, pre, _ = bd.fused_post_pre_with_config(cfg, *fused_args(inp), **fused_kw(inp))
    bf16_close(f"R' {seed_note(name)}", res, want.residual)
    # tensor cores: fn as bf16 hi + lo carries it to ~2^-16 relative, products exact, fp32 accumulation
    assert_close("post", post.squeeze(-1), want.post, **TOL, why=WHY + "; fn hi+lo split")
    assert_close("comb", comb, want.comb, **TOL, why=WHY + "; fn hi+lo split")
    assert_close("pre_mix", pre, want.pre_mix, **TOL, why=WHY + "; fn hi+lo split")
    bf16_close(f"layer_input {seed_note(name)}", li, want.layer_input)


@requires_cuda
@pytest.mark.parametrize("num_tokens", POST_TOKENS)
def test_post_kernel_matches_spec(num_tokens):
    from deepinfer_sm80.ops.mhc import boundary as bd

    inp = boundary_inputs(f"gpu-post-T{num_tokens}", num_tokens, HIDDEN).to("cuda")
    out = bd.mhc_post_tilelang(*post_args(inp))
    # FMA contraction in the kernel vs separately rounded products in torch (H200 run: 4 of 102400 flips)
    bf16_close("R'", out, ref.post_map(inp.x, inp.residual, inp.post, inp.comb).to(torch.bfloat16))


def _upstream_tilelang():
    try:
        from deepinfer_sm80.testing.tilelang_compile import bind_vllm_tilelang_globals

        bind_vllm_tilelang_globals()
        from vllm.model_executor.kernels.mhc import tilelang as up
    except Exception as exc:  # no vLLM tree / TileLang on this box
        pytest.skip(f"upstream TileLang mHC not importable: {exc}")
    return up


@requires_cuda
@pytest.mark.parametrize("num_tokens", UPSTREAM_TOKENS)
def test_fused_matches_upstream_kernels(num_tokens):
    up = _upstream_tilelang()
    from deepinfer_sm80.ops.mhc import boundary as bd

    name = f"gpu-upstream-T{num_tokens}"
    inp = boundary_inputs(name, num_tokens, HIDDEN).to("cuda")
    args, kw = fused_args(inp), fused_kw(inp)
    theirs = up.mhc_fused_post_pre_delayed_tilelang(*args, **kw)
    mine = bd.mhc_fused_post_pre_delayed_tilelang(*args, **kw)
    # R' is the same formula and order in both: bytes equal
    assert_bitwise_equal("R'", mine[0], theirs[0])
    for i, field in ((1, "post"), (2, "comb"), (4, "pre_mix")):
        assert_close(field, mine[i], theirs[i], **UPSTREAM_TOL, why=UPSTREAM_WHY)
    bf16_close("layer_input", mine[3], theirs[3], frac=5e-3)


@requires_cuda
def test_first_layer_matches_upstream_kernels():
    up = _upstream_tilelang()
    from deepinfer_sm80.ops.mhc import boundary as bd

    inp = boundary_inputs("gpu-upstream-first", UPSTREAM_FIRST_TOKENS, HIDDEN).to("cuda")
    args, kw = pre_call(inp, first=True)
    theirs, mine = up.mhc_pre_delayed_tilelang(*args, **kw), bd.mhc_pre_delayed_tilelang(*args, **kw)
    for i, field in ((0, "post"), (1, "comb"), (3, "pre_mix")):
        assert_close(field, mine[i], theirs[i], **TOL, why=WHY)
    bf16_close("layer_input", mine[2], theirs[2])


@requires_cuda
def test_post_matches_upstream_kernel():
    up = _upstream_tilelang()
    from deepinfer_sm80.ops.mhc import boundary as bd

    inp = boundary_inputs("gpu-upstream-post", UPSTREAM_POST_TOKENS, HIDDEN).to("cuda")
    args = post_args(inp)
    assert_bitwise_equal("R'", bd.mhc_post_tilelang(*args), up.mhc_post_tilelang(*args))
