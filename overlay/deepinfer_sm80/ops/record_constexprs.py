"""The fp8_ds_mla record layout (formats/fp8_ds_mla.py) as `tl.constexpr` globals, written once.

A Triton kernel may read a module global only when it is a `tl.constexpr`; the KV gather, the KV
insert and the sparse-MLA tiles read these (imported under their old private names, so the kernel
bodies and their compiles are unchanged).
"""

from __future__ import annotations

import triton.language as tl

from deepinfer_sm80.formats.fp8_ds_mla import DATA_BYTES, GROUP, N_GROUPS, NOPE_DIM, ROPE_DIM, SCALE_BYTES

NOPE = tl.constexpr(NOPE_DIM)  # 448 e4m3 NoPE values
ROPE = tl.constexpr(ROPE_DIM)  # 64 bf16 RoPE values
DATA = tl.constexpr(DATA_BYTES)  # bytes of a page's data region per token
SCALE = tl.constexpr(SCALE_BYTES)  # bytes of a token's UE8M0 scales
GROUP_SIZE = tl.constexpr(GROUP)  # NoPE values per scale
GROUPS = tl.constexpr(N_GROUPS)  # scales per token
