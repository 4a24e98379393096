"""The three mHC entry points V4.1 calls, with vLLM 0.32.0's names and signatures, on our TileLang kernels.

Each boundary is two launches: split-h partials (post-map, collapse, projection) then the epilogue
(gates, Sinkhorn, RMSNorm). The split comes from `splits.partials_config(T, hidden, SM count)`.
"""

from __future__ import annotations

import torch

from deepinfer_sm80.device import sm_count
from deepinfer_sm80.ops.mhc import splits
from deepinfer_sm80.ops.mhc.reference import HC_MULT, MIX_SLOTS

EPILOGUE_THREADS = splits.EPILOGUE_COLUMNS // 8
POST_THREADS, POST_VEC = 128, 8  # 1024 columns per CTA, 16-byte loads


def _jit():  # imported on first launch: importing this module needs no TileLang
    from deepinfer_sm80.ops.mhc import jit

    return jit


def _check(name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"mhc: {name} has shape {tuple(t.shape)}, expected {shape}")
    if t.dtype != dtype:
        raise ValueError(f"mhc: {name} is {t.dtype}, expected {dtype}")
    if not t.is_contiguous():
        raise ValueError(f"mhc: {name} must be contiguous")


def _boundary(
    residual: torch.Tensor,
    fn: torch.Tensor,
    hc_scale: torch.Tensor,
    hc_base: torch.Tensor,
    eps: tuple[float, float, float, float, int, float],
    *,
    x: torch.Tensor | None,
    post: torch.Tensor | None,
    comb: torch.Tensor | None,
    pre_mix: torch.Tensor | None,
    gemm_input: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    capture_aux: bool,
    config: splits.PartialsConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    num_tokens, hc, hidden = residual.shape
    if hc != HC_MULT:
        raise ValueError(f"mhc: hc_mult must be {HC_MULT}, got {hc}")
    splits.check_hidden(hidden)
    _check("residual", residual, (num_tokens, hc, hidden), torch.bfloat16)
    gemm_width = gemm_input.shape[1] if gemm_input is not None else hc * hidden
    if gemm_width not in (hidden, hc * hidden):
        raise ValueError(f"mhc: projection input width {gemm_width} is neither {hidden} nor {hc * hidden}")
    _check("fn", fn, (MIX_SLOTS, gemm_width), torch.float32)
    _check("hc_scale", hc_scale, (3,), torch.float32)
    _check("hc_base", hc_base, (MIX_SLOTS,), torch.float32)
    has_post = post is not None
    if has_post:
        assert x is not None and comb is not None
        _check("x", x, (num_tokens, hidden), torch.bfloat16)
        _check("post_layer_mix", post, (num_tokens, hc), torch.float32)
        _check("comb_res_mix", comb, (num_tokens, hc, hc), torch.float32)
    if gemm_input is not None:
        _check("x", gemm_input, (num_tokens, hidden), torch.bfloat16)
    if pre_mix is not None:
        _check("pre_mix", pre_mix, (num_tokens, hc), torch.float32)
    if norm_weight is not None:
        _check("norm_weight", norm_weight, (hidden,), torch.bfloat16)

    dev = residual.device
    residual_out = torch.empty_like(residual) if has_post else residual
    post_out = torch.empty(num_tokens, hc, dtype=torch.float32, device=dev)
    comb_out = torch.empty(num_tokens, hc * hc, dtype=torch.float32, device=dev)
    pre_out = torch.empty(num_tokens, hc, dtype=torch.float32, device=dev)
    layer_input = torch.empty(num_tokens, hidden, dtype=torch.bfloat16, device=dev)
    aux = torch.empty(num_tokens if capture_aux else 0, hidden, dtype=torch.bfloat16, device=dev)
    outputs = (residual_out, post_out, comb_out, layer_input, pre_out, aux)
    if num_tokens == 0:
        return outputs

    tc_ok = has_post and pre_mix is not None and gemm_width == hc * hidden
    cfg = config or splits.partials_config(num_tokens, hidden, sm_count(dev.index or 0), tc_ok)
    if cfg.tc and not tc_ok:
        raise ValueError("mhc: the tensor-core partials need the fused post + pre with a carried pre-mix")
    part_mix = torch.empty(cfg.n_splits, num_tokens, MIX_SLOTS, dtype=torch.float32, device=dev)
    part_sq = torch.empty(cfg.n_splits, num_tokens, dtype=torch.float32, device=dev)
    part_ysq = torch.empty_like(part_sq)
    one = residual.new_empty(1, hc, hidden)  # placeholders for arguments a variant never reads
    jit = _jit()
    partials = jit.compiled(
        *partials_job(hidden, gemm_width, has_post, pre_mix is not None, capture_aux, cfg)
    )
    partials(
        residual,
        x if has_post else (gemm_input if gemm_input is not None else one[:, 0]),
        post if has_post else post_out[:1],
        comb if has_post else comb_out[:1].view(1, hc, hc),
        fn,
        pre_mix if pre_mix is not None else pre_out[:1],
        residual_out if has_post else one,
        layer_input,
        aux if capture_aux else one[:, 0],
        part_mix,
        part_sq,
        part_ysq,
    )
    epilogue = jit.compiled(
        "epilogue",
        epilogue_params(hidden, cfg.n_splits, gemm_width, eps, norm_weight is not None),
    )
    epilogue(
        part_mix,
        part_sq,
        part_ysq,
        hc_scale,
        hc_base,
        norm_weight if norm_weight is not None else layer_input[0],
        layer_input,
        post_out,
        comb_out,
        pre_out,
    )
    return outputs


def partials_job(
    hidden: int,
    gemm_width: int,
    has_post: bool,
    use_pre_mix: bool,
    write_aux: bool,
    cfg: splits.PartialsConfig,
) -> tuple[str, tuple[tuple[str, object], ...]]:
    """(kernel name, compile-time parameters) of the partials launch for this variant and config."""
    if cfg.tc:
        return "partials_tc", (("hidden", hidden), ("n_splits", cfg.n_splits), ("write_aux", write_aux))
    return "partials", partials_params(hidden, gemm_width, has_post, use_pre_mix, write_aux, cfg)


def partials_params(
    hidden: int,
    gemm_width: int,
    has_post: bool,
    use_pre_mix: bool,
    write_aux: bool,
    cfg: splits.PartialsConfig,
) -> tuple[tuple[str, object], ...]:
    return (
        ("hidden", hidden),
        ("gemm_width", gemm_width),
        ("has_post", has_post),
        ("use_pre_mix", use_pre_mix),
        ("write_aux", write_aux),
        ("block_m", cfg.block_m),
        ("n_thr", cfg.n_thr),
        ("n_splits", cfg.n_splits),
        ("vec", cfg.vec),
        ("n_groups", cfg.n_groups),
    )


def epilogue_params(
    hidden: int,
    n_splits: int,
    rms_numel: int,
    eps: tuple[float, float, float, float, int, float],
    use_norm: bool,
) -> tuple[tuple[str, object], ...]:
    rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, norm_eps = eps
    return (
        ("hidden", hidden),
        ("n_splits", n_splits),
        ("rms_numel", rms_numel),
        ("rms_eps", float(rms_eps)),
        ("hc_pre_eps", float(hc_pre_eps)),
        ("hc_sinkhorn_eps", float(hc_sinkhorn_eps)),
        ("hc_post_mult_value", float(hc_post_mult_value)),
        ("sinkhorn_repeat", int(sinkhorn_repeat)),
        ("norm_eps", float(norm_eps) if use_norm else 0.0),
        ("use_norm", use_norm),
        ("n_thr", EPILOGUE_THREADS),
    )


def mhc_pre_delayed_tilelang(
    residual: torch.Tensor,
    fn: torch.Tensor,
    hc_scale: torch.Tensor,
    hc_base: torch.Tensor,
    rms_eps: float,
    hc_pre_eps: float,
    hc_sinkhorn_eps: float,
    hc_post_mult_value: float,
    sinkhorn_repeat: int,
    pre_mix: torch.Tensor | None = None,
    x: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """mHC pre with a carried pre-mix (0.32.0 signature); returns (post [T,4,1], comb [T,4,4],
    layer_input [T,H] bf16, next pre-mix [T,4]). `x` [T,H] is the first layer's projection input."""
    eps = (rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, norm_eps)
    _, post, comb, layer_input, pre, _ = _boundary(
        residual,
        fn,
        hc_scale,
        hc_base,
        eps,
        x=None,
        post=None,
        comb=None,
        pre_mix=pre_mix,
        gemm_input=x,
        norm_weight=norm_weight,
        capture_aux=False,
    )
    num_tokens = residual.shape[0]
    return post.unsqueeze(-1), comb.view(num_tokens, HC_MULT, HC_MULT), layer_input, pre


def mhc_fused_post_pre_delayed_tilelang(
    x: torch.Tensor,
    residual: torch.Tensor,
    post_layer_mix: torch.Tensor,
    comb_res_mix: torch.Tensor,
    fn: torch.Tensor,
    hc_scale: torch.Tensor,
    hc_base: torch.Tensor,
    rms_eps: float,
    hc_pre_eps: float,
    hc_sinkhorn_eps: float,
    hc_post_mult_value: float,
    sinkhorn_repeat: int,
    pre_mix: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    capture_aux: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One post block and the next delayed pre block (0.32.0 signature); returns (R' [T,4,H],
    post [T,4,1], comb [T,4,4], layer_input [T,H], next pre-mix [T,4], stream mean [T or 0, H])."""
    return fused_post_pre_with_config(
        None, x, residual, post_layer_mix, comb_res_mix, fn, hc_scale, hc_base, rms_eps, hc_pre_eps,
        hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, pre_mix, norm_weight, norm_eps, capture_aux,
    )  # fmt: skip


def fused_post_pre_with_config(
    config: splits.PartialsConfig | None,
    x: torch.Tensor,
    residual: torch.Tensor,
    post_layer_mix: torch.Tensor,
    comb_res_mix: torch.Tensor,
    fn: torch.Tensor,
    hc_scale: torch.Tensor,
    hc_base: torch.Tensor,
    rms_eps: float,
    hc_pre_eps: float,
    hc_sinkhorn_eps: float,
    hc_post_mult_value: float,
    sinkhorn_repeat: int,
    pre_mix: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    capture_aux: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`mhc_fused_post_pre_delayed_tilelang` with the split forced to `config` (None: the selector's)."""
    num_tokens = residual.shape[0]
    eps = (rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, norm_eps)
    residual_cur, post, comb, layer_input, pre, aux = _boundary(
        residual,
        fn,
        hc_scale,
        hc_base,
        eps,
        x=x,
        post=post_layer_mix.reshape(num_tokens, HC_MULT),
        comb=comb_res_mix,
        pre_mix=pre_mix,
        gemm_input=None,
        norm_weight=norm_weight,
        capture_aux=capture_aux,
        config=config,
    )
    return residual_cur, post.unsqueeze(-1), comb.view(num_tokens, HC_MULT, HC_MULT), layer_input, pre, aux


def mhc_post_tilelang(
    x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor
) -> torch.Tensor:
    """R'[j] = post[j]*x + sum_k comb[k,j]*R[k] (0.32.0 signature): [T,H], [T,4,H], [T,4(,1)], [T,4,4]."""
    num_tokens, hc, hidden = residual.shape
    splits.check_hidden(hidden)
    post = post_layer_mix.reshape(num_tokens, hc)
    _check("residual", residual, (num_tokens, hc, hidden), torch.bfloat16)
    _check("x", x, (num_tokens, hidden), torch.bfloat16)
    _check("post_layer_mix", post, (num_tokens, hc), torch.float32)
    _check("comb_res_mix", comb_res_mix, (num_tokens, hc, hc), torch.float32)
    out = torch.empty_like(residual)
    if num_tokens == 0:
        return out
    kernel = _jit().compiled("post", (("hidden", hidden), ("n_thr", POST_THREADS), ("vec", POST_VEC)))
    kernel(comb_res_mix, residual, post, x, out)
    return out


def warmup(
    max_tokens: int,
    hidden: int,
    sm_count_: int,
    eps: tuple[float, float, float, float, int, float],
    max_workers: int = 8,
) -> int:
    """Compile every config a server with `max_tokens` per step can select, before the first request.

    Covers the first layer (projection of x, stream 0), the fused post + pre with and without the
    aux mean, the engram-style pre with a carried pre-mix, and the final post; nvcc runs in
    `max_workers` parallel jobs. Returns the kernel count.
    """
    jit = _jit()
    jobs: list[tuple[str, tuple[tuple[str, object], ...]]] = []
    for gemm_width, has_post, use_pre, aux in (
        (hidden, False, False, False),
        (HC_MULT * hidden, True, True, False),
        (HC_MULT * hidden, True, True, True),
        (HC_MULT * hidden, False, True, False),
    ):
        tc_ok = has_post and use_pre
        for cfg in splits.configs_for_server(max_tokens, hidden, sm_count_, tc_ok):
            jobs.append(partials_job(hidden, gemm_width, has_post, use_pre, aux, cfg))
    for n_splits in splits.split_counts_for_server(max_tokens, hidden, sm_count_):
        for rms_numel in (hidden, HC_MULT * hidden):
            jobs.append(("epilogue", epilogue_params(hidden, n_splits, rms_numel, eps, True)))
    jobs.append(("post", (("hidden", hidden), ("n_thr", POST_THREADS), ("vec", POST_VEC))))
    jit.compile_many(jobs, max_workers)
    return len(jobs)
