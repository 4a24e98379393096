"""Device facts: SM80/SM86 (and Ada SM89) per-SM and per-block limits (docs/MODEL.md), the occupancy
they allow, and the SM count of the GPU a launch runs on.

Shipped code (launch heuristics, startup notes) and the rig (cross-compile budgets) read them here;
importing this module needs no torch and no GPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@functools.cache
def sm_count(device_index: int) -> int:
    """Streaming multiprocessors of CUDA device `device_index`, read once per process."""
    import torch

    return torch.cuda.get_device_properties(device_index).multi_processor_count


@dataclass(frozen=True)
class SmBudget:
    arch: int
    smem_per_sm: int  # bytes usable by CTAs on one SM
    smem_per_block: int  # opt-in max dynamic shared memory per block
    regs_per_sm: int
    max_regs_per_thread: int
    max_threads_per_sm: int
    max_ctas_per_sm: int
    # the driver reserves 1 KB of shared memory per CTA on sm_80+
    smem_reserved_per_cta: int = 1024
    # registers are allocated per warp in units of 256
    reg_alloc_unit: int = 256


SM80 = SmBudget(80, 167_936, 166_912, 65_536, 255, 2048, 32)  # 164 KB/SM, 163 KB opt-in
SM86 = SmBudget(86, 102_400, 101_376, 65_536, 255, 1536, 16)  # 100 KB/SM, 99 KB opt-in
# Ada (RTX 4090 / 6000 Ada, L40S, L4): sm_86's shared memory and threads, 24 resident CTAs per SM
SM89 = SmBudget(89, 102_400, 101_376, 65_536, 255, 1536, 24)
BUDGETS = {80: SM80, 86: SM86}  # the images' TORCH_CUDA_ARCH_LIST (docker/selftest.py checks the match)
# what `make sm80-report` compiles for: the images' arches plus Ada (issue 22), which the binding table
# serves too (bindings.NO_FLASHMLA_CAPABILITY) with upstream's hardware-fp8 writers
REPORT_BUDGETS = {**BUDGETS, 89: SM89}
HW_FP8_ARCH = 89  # first arch where an e4m3 conversion in the PTX is legal


def max_ctas_per_sm(budget: SmBudget, regs: int, smem: int, num_warps: int) -> int:
    """CTAs of this kernel that fit on one SM at once (0 if one does not fit)."""
    threads = 32 * num_warps
    by_threads = budget.max_threads_per_sm // threads
    regs_per_warp = -(-max(regs, 1) * 32 // budget.reg_alloc_unit) * budget.reg_alloc_unit
    by_regs = budget.regs_per_sm // (regs_per_warp * num_warps)
    by_smem = budget.smem_per_sm // (smem + budget.smem_reserved_per_cta)
    return min(by_threads, by_regs, by_smem, budget.max_ctas_per_sm)


def over_budget(budget: SmBudget, regs: int, spill_bytes: int, smem: int, num_warps: int) -> list[str]:
    """Reasons this kernel breaks the budget (empty when it fits with no spills)."""
    problems = []
    if spill_bytes:
        problems.append(f"{spill_bytes} B of local memory (spills)")
    if regs > budget.max_regs_per_thread:
        problems.append(f"{regs} registers > {budget.max_regs_per_thread}")
    if smem > budget.smem_per_block:
        problems.append(f"{smem} B shared > {budget.smem_per_block} B per block on sm_{budget.arch}")
    if max_ctas_per_sm(budget, regs, smem, num_warps) == 0:
        problems.append("not even one CTA fits on an SM")
    return problems
