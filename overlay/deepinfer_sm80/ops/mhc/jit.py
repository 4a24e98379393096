"""The process's compiled mHC kernels: one TileLang compile per (kernel, compile-time parameters).

Both kernel modules are imported here, so neither needs the other's cache (kernels_tc builds on
kernels' constants; the cache that names both lives above them). Imported on the first launch or
warm-up only: importing `ops.mhc` or `boundary` needs no TileLang.
"""

from __future__ import annotations

from typing import Any

from deepinfer_sm80.ops.mhc.kernels import mhc_epilogue_kernel, mhc_partials_kernel, mhc_post_kernel
from deepinfer_sm80.ops.mhc.kernels_tc import mhc_partials_tc_kernel

Params = tuple[tuple[str, Any], ...]
# insertion order is the order compile_many elaborates them in
JITS: dict[str, Any] = {
    "partials": mhc_partials_kernel,
    "epilogue": mhc_epilogue_kernel,
    "post": mhc_post_kernel,
    "partials_tc": mhc_partials_tc_kernel,
}
_COMPILED: dict[tuple[str, Params], Any] = {}


def compiled(kernel_name: str, params: Params) -> Any:
    """One compiled kernel per (kernel, compile-time parameters), kept for the process."""
    key = (kernel_name, params)
    kernel = _COMPILED.get(key)
    if kernel is None:
        kernel = _COMPILED[key] = JITS[kernel_name].compile(**dict(params))
    return kernel


def compile_many(jobs: list[tuple[str, Params]], num_workers: int) -> None:
    """Compile the missing jobs with TileLang's par_compile (serial elaboration, parallel nvcc)."""
    for kernel_name, jit in JITS.items():
        missing = list(dict.fromkeys(p for n, p in jobs if n == kernel_name and (n, p) not in _COMPILED))
        if missing:
            built = jit.par_compile([dict(p) for p in missing], num_workers=num_workers)
            _COMPILED.update({(kernel_name, p): k for p, k in zip(missing, built, strict=True)})
