"""Cross-compile registered Triton kernels for sm_80/sm_86 (and Ada sm_89) on a machine with no GPU.

Resources are read from the compiled cubin with the `cuobjdump` that Triton's wheel carries.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from deepinfer_sm80.device import HW_FP8_ARCH, REPORT_BUDGETS, max_ctas_per_sm, over_budget
from deepinfer_sm80.registry import CompileSpec

_RES_LINE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


@dataclass(frozen=True)
class CompileReport:
    name: str
    arch: int
    num_warps: int
    regs: int
    stack_bytes: int
    local_bytes: int
    smem_bytes: int  # static (cubin) + dynamic (Triton metadata)
    max_ctas_per_sm: int
    uses_hw_fp8: bool  # any cvt to/from e4m3 in the PTX: illegal below sm_89
    problems: tuple[str, ...]

    @property
    def spill_bytes(self) -> int:
        return self.stack_bytes + self.local_bytes

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "spill_bytes": self.spill_bytes}


def cuobjdump_path() -> Path:
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def read_resources(cubin: bytes) -> tuple[int, int, int, int]:
    """(registers, stack bytes, static shared bytes, local bytes) of the one kernel in a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        text = subprocess.run(
            [str(cuobjdump_path()), "-res-usage", fh.name], check=True, capture_output=True, text=True
        ).stdout
    found = _RES_LINE.findall(text)
    if len(found) != 1:
        raise RuntimeError(f"expected one kernel in cuobjdump output, got {len(found)}:\n{text}")
    regs, stack, shared, local = (int(v) for v in found[0])
    return regs, stack, shared, local


def compile_for(spec: CompileSpec, arch: int) -> CompileReport:
    """Compile one spec for sm_<arch> and check it against that arch's budget."""
    attrs = {(spec.fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in spec.divisible_by_16}
    src = ASTSource(fn=spec.fn, signature=spec.signature, constexprs=spec.constexprs, attrs=attrs)
    compiled = triton.compile(
        src,
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": spec.num_warps, "num_stages": spec.num_stages},
    )
    regs, stack, static_smem, local = read_resources(compiled.asm["cubin"])
    smem = static_smem + int(compiled.metadata.shared)
    budget = REPORT_BUDGETS[arch]
    uses_hw_fp8 = bool(re.search(r"cvt\.[a-z0-9.]*e4m3", compiled.asm["ptx"]))  # f32->e4m3 and e4m3x2->f16x2
    problems = over_budget(budget, regs, stack + local, smem, spec.num_warps)
    if uses_hw_fp8 and arch < HW_FP8_ARCH:  # legal from sm_89 (upstream's writers there use it)
        problems.append("hardware e4m3 conversion in PTX (needs sm_89)")
    return CompileReport(
        name=spec.name,
        arch=arch,
        num_warps=spec.num_warps,
        regs=regs,
        stack_bytes=stack,
        local_bytes=local,
        smem_bytes=smem,
        max_ctas_per_sm=max_ctas_per_sm(budget, regs, smem, spec.num_warps),
        uses_hw_fp8=uses_hw_fp8,
        problems=tuple(problems),
    )
