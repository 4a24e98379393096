"""mHC hyper-connection boundaries (hc_mult 4) for SM80/SM86: reference, split selector, TileLang kernels.

`boundary` holds the entry points with vLLM 0.32.0's names; `TILELANG_SPECS` lists every kernel
(ours and the upstream ones the SM8x path launches) for `make sm80-report`. Importing this package
needs no TileLang; only a launch or a compile does.
"""

from __future__ import annotations

from deepinfer_sm80.ops.mhc import splits
from deepinfer_sm80.ops.mhc.boundary import epilogue_params, partials_job, partials_params
from deepinfer_sm80.registry import TileLangSpec

_OURS = "deepinfer_sm80.ops.mhc.kernels"
_UPSTREAM = "vllm.model_executor.kernels.mhc.tilelang_kernels"
# V4.1 scalars (config: rms_norm_eps 1e-20, hc_eps 1e-6, 20 Sinkhorn iterations; alpha 2 hard-coded)
V41_EPS = (1e-20, 1e-6, 1e-6, 2.0, 20, 1e-20)
A100_SMS = 108
REPORT_TOKENS = (1, 6, 32, 64, 1536)


def _ours() -> tuple[TileLangSpec, ...]:
    specs = []
    hidden = 5120
    for t in REPORT_TOKENS:
        cfg = splits.partials_config(t, hidden, A100_SMS, tensor_cores=True)
        tag = f"bm{cfg.block_m}-t{cfg.n_thr}-s{cfg.n_splits}-v{cfg.vec}-g{cfg.n_groups}"
        name, params = partials_job(hidden, 4 * hidden, True, True, False, cfg)
        kernel = f"{_OURS}_tc:mhc_partials_tc_kernel" if cfg.tc else f"{_OURS}:mhc_partials_kernel"
        specs.append(TileLangSpec(f"mhc_{name} post+pre h{hidden} T{t} {tag}", kernel, dict(params)))
    tc = splits.partials_config(1536, hidden, A100_SMS, tensor_cores=True)
    name, params = partials_job(hidden, 4 * hidden, True, True, True, tc)
    specs.append(
        TileLangSpec(f"mhc_{name} aux h{hidden} T1536", f"{_OURS}_tc:mhc_partials_tc_kernel", dict(params))
    )
    cfg = splits.partials_config(1536, hidden, A100_SMS)  # CUDA-core partials at many tokens (pre-only)
    params = dict(partials_params(hidden, 4 * hidden, False, True, False, cfg))
    specs.append(TileLangSpec(f"mhc_partials pre h{hidden} T1536", f"{_OURS}:mhc_partials_kernel", params))
    first = splits.partials_config(1, hidden, A100_SMS)
    for label, width, post, pre, aux in (
        ("first-layer", hidden, False, False, False),
        ("aux", 4 * hidden, True, True, True),
    ):
        params = dict(partials_params(hidden, width, post, pre, aux, first))
        specs.append(
            TileLangSpec(f"mhc_partials {label} h{hidden} T1", f"{_OURS}:mhc_partials_kernel", params)
        )
    for n_splits in sorted(
        {splits.partials_config(t, hidden, A100_SMS, True).n_splits for t in REPORT_TOKENS}
    ):
        params = dict(epilogue_params(hidden, n_splits, 4 * hidden, V41_EPS, True))
        specs.append(
            TileLangSpec(f"mhc_epilogue h{hidden} s{n_splits}", f"{_OURS}:mhc_epilogue_kernel", params)
        )
    for other in (4096, 7168):
        cfg = splits.partials_config(1, other, A100_SMS)
        params = dict(partials_params(other, 4 * other, True, True, False, cfg))
        specs.append(
            TileLangSpec(f"mhc_partials post+pre h{other} T1", f"{_OURS}:mhc_partials_kernel", params)
        )
        params = dict(epilogue_params(other, cfg.n_splits, 4 * other, V41_EPS, True))
        specs.append(
            TileLangSpec(f"mhc_epilogue h{other} s{cfg.n_splits}", f"{_OURS}:mhc_epilogue_kernel", params)
        )
    specs.append(
        TileLangSpec("mhc_post h5120", f"{_OURS}:mhc_post_kernel", {"hidden": hidden, "n_thr": 128, "vec": 8})
    )
    return tuple(specs)


def _upstream() -> tuple[TileLangSpec, ...]:
    """The upstream kernels 0.32.0 launches on SM8x for V4.1 (no DeepGEMM: prenorm GEMM n_splits 1)."""
    rms = dict(
        rms_eps=1e-20, hc_pre_eps=1e-6, hc_sinkhorn_eps=1e-6, hc_post_mult_value=2.0, sinkhorn_repeat=20
    )
    norm = dict(**rms, norm_eps=1e-20, hc_mult=4, save_pre_mix=True)
    gemm = f"{_UPSTREAM}:hc_prenorm_gemm_tilelang"
    specs = [
        TileLangSpec(
            "upstream mhc_post_tilelang", f"{_UPSTREAM}:mhc_post_tilelang", {"hc": 4, "hidden": 5120}, True
        ),
        # the delayed pre passes (input_size, hc_mult=1): first layer 5120, later sublayers 20480
        TileLangSpec(
            "upstream hc_prenorm_gemm k5120 T<128",
            gemm,
            {"hidden_size": 5120, "hc_mult": 1, "n_out": 24, "n_thr": 1024, "tile_n": 4, "n_splits": 1},
            True,
        ),
        TileLangSpec(
            "upstream hc_prenorm_gemm k20480 T<128",
            gemm,
            {"hidden_size": 20480, "hc_mult": 1, "n_out": 24, "n_thr": 1024, "tile_n": 4, "n_splits": 1},
            True,
        ),
        TileLangSpec(
            "upstream hc_prenorm_gemm k20480 128<=T<1024",
            gemm,
            {"hidden_size": 20480, "hc_mult": 1, "n_out": 24, "n_thr": 512, "tile_n": 12, "n_splits": 1},
            True,
        ),
        TileLangSpec(
            "upstream hc_prenorm_gemm_block_m k20480 T>=1024",
            f"{_UPSTREAM}:hc_prenorm_gemm_block_m_tilelang",
            {"hidden_size": 20480, "hc_mult": 1, "n_out": 24, "n_thr": 512, "tile_n": 12, "block_m": 2},
            True,
        ),
    ]
    for tile_n in (2, 6):  # T 1-15 and 16-32 (mhc_fused_post_pre_split_config)
        specs.append(
            TileLangSpec(
                f"upstream mhc_fused_tilelang tile_n{tile_n} s8 t128",
                f"{_UPSTREAM}:mhc_fused_tilelang",
                {"hc": 4, "hidden": 5120, "n_out": 24, "n_thr": 128, "tile_n": tile_n},
                True,
            )
        )
    fuse = f"{_UPSTREAM}:mhc_pre_big_fuse_with_norm_tilelang"
    for label, n_splits, rms_numel, pre_in, aux in (
        ("first layer s1", 1, 5120, False, False),
        ("fused s8", 8, 20480, True, False),
        ("unfused s1", 1, 20480, True, False),
        ("fused s8 aux", 8, 20480, True, True),
    ):
        params = dict(
            hidden_size=5120,
            **norm,
            n_splits=n_splits,
            use_pre_mix_in=pre_in,
            rms_numel=rms_numel,
            write_aux=aux,
        )
        specs.append(TileLangSpec(f"upstream mhc_pre_big_fuse_with_norm {label}", fuse, params, True))
    return tuple(specs)


TILELANG_SPECS: tuple[TileLangSpec, ...] = _ours() + _upstream()
