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


@dataclass(frozen=True, order=True)
class PartialsConfig:
    block_m: int  # tokens per CTA: each fn element loaded once is used for block_m tokens
    n_thr: int
    n_splits: int  # h-slices; partials [n_splits, T, 24] are reduced in the epilogue
    vec: int  # consecutive columns per thread per iteration (bf16 loads of 2*vec bytes)

    def columns_per_iteration(self) -> int:
        return self.n_thr * self.vec


def _shape_for_tokens(num_tokens: int) -> tuple[int, int, int]:
    """(block_m, n_thr, vec) by token band; the split count then fills the GPU."""
    if num_tokens <= 4:
        return 1, 32, 4  # one warp per CTA: the most CTAs for the few columns there are
    if num_tokens <= 16:
        return 2, 64, 4
    if num_tokens <= 64:
        return 4, 64, 2
    return 4, 128, 2


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_hidden(hidden: int) -> None:
    if hidden % EPILOGUE_COLUMNS or hidden % COLUMN_UNIT:
        raise ValueError(f"mHC kernels need hidden % {EPILOGUE_COLUMNS} == 0, got hidden={hidden}")


def partials_config(num_tokens: int, hidden: int, sm_count: int) -> PartialsConfig:
    """The split for `num_tokens` rows on a GPU with `sm_count` SMs (read at run time)."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    if sm_count < 1:
        raise ValueError(f"sm_count must be >= 1, got {sm_count}")
    check_hidden(hidden)
    block_m, n_thr, vec = _shape_for_tokens(num_tokens)
    units = hidden // (n_thr * vec)
    m_blocks = -(-num_tokens // block_m)
    budget = CTAS_PER_SM * sm_count
    fitting = [d for d in _divisors(units) if m_blocks * d <= budget]
    n_splits = max(fitting) if fitting else 1
    return PartialsConfig(block_m, n_thr, n_splits, vec)


def configs_for_server(max_tokens: int, hidden: int, sm_count: int) -> tuple[PartialsConfig, ...]:
    """Every partials config T in 1..max_tokens selects: what the JIT warm-up compiles."""
    return tuple(sorted({partials_config(t, hidden, sm_count) for t in range(1, max_tokens + 1)}))


def split_counts_for_server(max_tokens: int, hidden: int, sm_count: int) -> tuple[int, ...]:
    """The epilogue compiles per split count: the distinct ones the partials configs use."""
    return tuple(sorted({c.n_splits for c in configs_for_server(max_tokens, hidden, sm_count)}))
