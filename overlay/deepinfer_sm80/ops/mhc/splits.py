"""Launch configurations of the mHC kernels, chosen from the token count and the SM count (no TileLang here).

One source of truth for the launch, the compile specs and the JIT warm-up: every config a server
can pick for T in 1..max_tokens is `configs_for_server(...)`.
"""

from __future__ import annotations

from dataclasses import dataclass

# The h-slice of one CTA is a whole number of (threads x vec) columns: 5120 = 40 x 128,
# 4096 = 32 x 128, 7168 = 56 x 128. A hidden size that is not a multiple of 128 is refused.
COLUMN_UNIT = 128
EPILOGUE_COLUMNS = 1024  # 128 threads x 8 bf16 per epilogue CTA (4096, 5120, 7168 all divide)
# At most this many CTAs of the partials kernel per SM: beyond it the split only adds partials to
# reduce; below one wave a token count this small leaves SMs idle.
CTAS_PER_SM = 2
# From this many tokens the fused post + pre projection runs on tensor cores (kernels_tc): 64 tokens
# per CTA read fn once, where the CUDA-core partials read it once per 4 tokens (768 MB from L2 at
# T = 1536). Below it the 64-token tile is mostly padding.
TC_MIN_TOKENS = 128
TC_BLOCK_M, TC_THREADS, TC_COLUMNS = 64, 256, 32  # kernels_tc: tokens, threads, columns per GEMM step
TC_MAX_SPLITS = 40


@dataclass(frozen=True, order=True)
class PartialsConfig:
    block_m: int  # tokens per CTA: each fn element loaded once is used for block_m tokens
    n_thr: int
    n_splits: int  # h-slices; partials [n_splits, T, 24] are reduced in the epilogue
    vec: int  # consecutive columns per thread per iteration (bf16 loads of 2*vec bytes)
    tc: bool = False  # tensor-core partials (fused post + pre with a carried pre-mix only)
    n_groups: int = 1  # warps split the 24 projections in this many groups over the same columns

    def __post_init__(self) -> None:
        warps = self.n_thr // 32
        if self.n_thr % 32 or warps % self.n_groups or 24 % self.n_groups:
            raise ValueError(f"{self}: threads must be whole warps and n_groups divide both the warps and 24")

    def columns_per_iteration(self) -> int:
        if self.tc:
            return TC_COLUMNS
        return 32 * (self.n_thr // 32 // self.n_groups) * self.vec


def _shape_for_tokens(num_tokens: int) -> tuple[int, int, int, int]:
    """(block_m, n_thr, vec, n_groups) by token band; the split count then fills the GPU.

    At few tokens the partials are latency-bound: 4 output groups cut a thread's fn loads from 96
    to 24 float4 (one memory round at 128 registers; the first H200 run, one warp doing all 96,
    took 13.0 us at T = 1). With more tokens per CTA the fn loads are reused and fewer groups do.
    """
    if num_tokens <= 4:
        return 1, 128, 4, 4
    if num_tokens <= 16:
        return 2, 128, 4, 4
    if num_tokens <= 64:
        return 4, 128, 2, 2
    return 4, 128, 2, 1


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_hidden(hidden: int) -> None:
    if hidden % EPILOGUE_COLUMNS or hidden % COLUMN_UNIT:
        raise ValueError(f"mHC kernels need hidden % {EPILOGUE_COLUMNS} == 0, got hidden={hidden}")


def partials_config(
    num_tokens: int, hidden: int, sm_count: int, tensor_cores: bool = False
) -> PartialsConfig:
    """The split for `num_tokens` rows on a GPU with `sm_count` SMs (read at run time).

    `tensor_cores`: the caller's variant can run the tensor-core partials (fused post + pre with a
    carried pre-mix); they are picked from TC_MIN_TOKENS tokens on.
    """
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    if sm_count < 1:
        raise ValueError(f"sm_count must be >= 1, got {sm_count}")
    check_hidden(hidden)
    budget = CTAS_PER_SM * sm_count
    if tensor_cores and num_tokens >= TC_MIN_TOKENS:
        m_blocks = -(-num_tokens // TC_BLOCK_M)
        fitting = [
            d for d in _divisors(hidden // TC_COLUMNS) if d <= TC_MAX_SPLITS and m_blocks * d <= budget
        ]
        return PartialsConfig(TC_BLOCK_M, TC_THREADS, max(fitting) if fitting else 1, 8, tc=True)
    block_m, n_thr, vec, n_groups = _shape_for_tokens(num_tokens)
    units = hidden // (32 * (n_thr // 32 // n_groups) * vec)
    m_blocks = -(-num_tokens // block_m)
    fitting = [d for d in _divisors(units) if m_blocks * d <= budget]
    n_splits = max(fitting) if fitting else 1
    return PartialsConfig(block_m, n_thr, n_splits, vec, n_groups=n_groups)


def configs_for_server(
    max_tokens: int, hidden: int, sm_count: int, tensor_cores: bool = False
) -> tuple[PartialsConfig, ...]:
    """Every partials config T in 1..max_tokens selects: what the JIT warm-up compiles."""
    return tuple(
        sorted({partials_config(t, hidden, sm_count, tensor_cores) for t in range(1, max_tokens + 1)})
    )


def split_counts_for_server(max_tokens: int, hidden: int, sm_count: int) -> tuple[int, ...]:
    """The epilogue compiles per split count: the distinct ones the partials configs use."""
    return tuple(
        sorted(
            {c.n_splits for tc in (False, True) for c in configs_for_server(max_tokens, hidden, sm_count, tc)}
        )
    )
