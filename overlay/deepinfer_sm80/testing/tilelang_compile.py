"""Cross-compile TileLang kernels for sm_80/sm_86 with no GPU: TileLang -> CUDA C -> nvcc -> cubin.

A module under `deepinfer_sm80.ops` lists its TileLang kernels in a module-level `TILELANG_SPECS`
tuple of `TileLangSpec`; `compile_tilelang(spec, arch)` returns the same `CompileReport` the
Triton cross-compile does (registers, spills and static + dynamic shared memory from the cubin and
the lowered kernel's attributes, checked against `device.REPORT_BUDGETS`).
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deepinfer_sm80.device import REPORT_BUDGETS, max_ctas_per_sm, over_budget
from deepinfer_sm80.registry import TileLangSpec

if TYPE_CHECKING:
    from deepinfer_sm80.testing.crosscompile import CompileReport

# vLLM 0.32.0 builds its TileLang kernels with this ptxas level on CUDA (vllm/tilelang_utils); the
# CPU import path leaves it out, so the cross-compile adds it back for upstream's kernels.
UPSTREAM_PTXAS_REGISTER_USAGE_LEVEL = 10
_RES_LINE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


def tilelang_missing_reason() -> str | None:
    """Why TileLang kernels cannot be cross-compiled here (None when they can)."""
    try:
        import tilelang  # noqa: F401
    except Exception as exc:  # ImportError, or a broken native library
        return f"tilelang not importable: {exc.__class__.__name__}: {exc}"
    if shutil.which("nvcc") is None:
        return "nvcc not on PATH"
    return None


def bind_vllm_tilelang_globals() -> None:
    """vllm.tilelang_utils binds `T`/`tilelang` only when vLLM's platform is CUDA (not on a CPU host,
    nor from the GPU bundle's tree, which has no vllm._C): bind them before upstream's kernels import."""
    import tilelang
    import tilelang.language

    utils = importlib.import_module("vllm.tilelang_utils")
    if utils.T is None:
        utils.T = tilelang.language
        utils.tilelang = tilelang
    # a kernel module imported earlier in this process (vLLM's model code imports it) saw T = None and
    # built its kernels without tensor annotations: import it again now that T is bound
    for name, module in list(sys.modules.items()):
        # name first: getattr on a lazy package (transformers) would import its submodules
        mhc = name.startswith("vllm.model_executor.kernels.mhc")
        if mhc and getattr(module, "T", tilelang.language) is None:
            importlib.reload(module)


def resolve(target: str) -> Any:
    module_name, attr = target.split(":")
    if module_name.startswith("vllm."):
        bind_vllm_tilelang_globals()
    return getattr(importlib.import_module(module_name), attr)


@dataclass(frozen=True)
class Lowered:
    source: str
    threads: int
    dynamic_smem: int


def lower(spec: TileLangSpec, arch: int) -> Lowered:
    """TileLang -> CUDA C for sm_<arch>, with the kernel's thread count and dynamic shared memory."""
    import tilelang
    import tvm
    from tvm.target import Target

    jit = resolve(spec.kernel)
    prim = jit.get_tir(**spec.params)
    target = Target({"kind": "cuda", "arch": f"sm_{arch}"})
    with tvm.transform.PassContext(config=dict(jit.pass_configs or {})), target:
        artifact = tilelang.lower(prim, target=target)
    threads, smem = 0, 0
    for _, func in artifact.device_mod.functions.items():
        attrs = func.attrs
        if attrs is None or "thread_extent" not in attrs:
            continue
        extent = attrs["thread_extent"]
        threads = max(threads, int(extent.get("threadIdx.x", 1)) * int(extent.get("threadIdx.y", 1)))
        if "dyn_shared_memory_buf" in attrs:
            smem = max(smem, int(attrs["dyn_shared_memory_buf"]))
    return Lowered(artifact.kernel_source, threads, smem)


def _nvcc_cubin(source: str, arch: int, upstream: bool) -> bytes:
    from tilelang.env import CUTLASS_INCLUDE_DIR, TILELANG_TEMPLATE_PATH

    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "kernel.cu", Path(tmp) / "kernel.cubin"
        src.write_text(source)
        cmd = [
            "nvcc",
            "--cubin",
            "-O3",
            "-std=c++20",
            "-w",
            f"-arch=sm_{arch}",
            f"-I{TILELANG_TEMPLATE_PATH}",
            f"-I{CUTLASS_INCLUDE_DIR}",
            "-o",
            str(out),
            str(src),
        ]
        if upstream:
            cmd.insert(4, f"--ptxas-options=--register-usage-level={UPSTREAM_PTXAS_REGISTER_USAGE_LEVEL}")
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
        if done.returncode != 0:
            raise RuntimeError(f"nvcc failed for sm_{arch}:\n{done.stderr[-4000:]}")
        return out.read_bytes()


def _resources(cubin: bytes) -> tuple[int, int, int, int]:
    from deepinfer_sm80.testing.crosscompile import cuobjdump_path

    tool = shutil.which("cuobjdump") or str(cuobjdump_path())
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        text = subprocess.run(
            [tool, "-res-usage", fh.name], check=True, capture_output=True, text=True
        ).stdout
    found = _RES_LINE.findall(text)
    if len(found) != 1:
        raise RuntimeError(f"expected one kernel in cuobjdump output, got {len(found)}:\n{text}")
    regs, stack, shared, local = (int(v) for v in found[0])
    return regs, stack, shared, local


def compile_tilelang(spec: TileLangSpec, arch: int) -> CompileReport:
    """Lower, compile and budget-check one spec for sm_<arch>."""
    from deepinfer_sm80.testing.crosscompile import CompileReport

    lowered = lower(spec, arch)
    regs, stack, static_smem, local = _resources(_nvcc_cubin(lowered.source, arch, spec.upstream))
    smem = static_smem + lowered.dynamic_smem
    num_warps = max(1, lowered.threads // 32)
    budget = REPORT_BUDGETS[arch]
    body = lowered.source.split('extern "C" __global__', 1)[-1]
    uses_hw_fp8 = bool(re.search(r"fp8_e4|e4m3", body))
    problems = over_budget(budget, regs, stack + local, smem, num_warps)
    if uses_hw_fp8:
        problems.append("e4m3 type in the kernel body (hardware FP8 needs sm_89)")
    return CompileReport(
        name=spec.name,
        arch=arch,
        num_warps=num_warps,
        regs=regs,
        stack_bytes=stack,
        local_bytes=local,
        smem_bytes=smem,
        max_ctas_per_sm=max_ctas_per_sm(budget, regs, smem, num_warps),
        uses_hw_fp8=uses_hw_fp8,
        problems=tuple(problems),
    )


def _compile_chunk(jobs: list[tuple[TileLangSpec, int]]) -> list[CompileReport]:
    return [compile_tilelang(spec, arch) for spec, arch in jobs]


def compile_all(specs: tuple[TileLangSpec, ...], archs: tuple[int, ...] = (80, 86), workers: int = 2) -> list:
    """Every (spec, arch), in `workers` processes (each imports TileLang once, ~5 s); input order kept.

    Serially the mHC specs take ~400 s on two shared cores (upstream's 96-thread epilogue alone
    13-43 s per arch), so the report splits them over processes rather than threads: TileLang's
    lowering holds the GIL.
    """
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(spec, arch) for spec in specs for arch in archs]
    if workers <= 1 or len(jobs) < 2:
        return _compile_chunk(jobs)
    chunks = [jobs[i::workers] for i in range(workers)]
    with ProcessPoolExecutor(workers) as pool:
        done = list(pool.map(_compile_chunk, chunks))
    by_job = {}
    for chunk, reports in zip(chunks, done, strict=True):
        by_job.update({(id(spec), arch): r for (spec, arch), r in zip(chunk, reports, strict=True)})
    return [by_job[(id(spec), arch)] for spec, arch in jobs]
