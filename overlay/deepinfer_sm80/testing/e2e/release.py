"""Engines on the release-structured tiny checkpoint (issue 37, item 4; scripts/tiny_v41_release.py).

    make e2e-release   # python -m deepinfer_sm80.testing.e2e --model .cache/tiny-v41-release ...

That checkpoint has DeepSeek-V4.1-Flash's own 40-layer structure (ratio 0 at 0-1, ratio 2 at 2-19 with
kv + index sources 2, 8, 14, ratio 1 at 20-39 with source and candidate source 20 and index sources 24,
28, 32, 36, Engram at 1 and 14, DSpark aux layers 37, 38, 39) at reduced dimensions, so the release's
real partitions run here: 14,14,12 (Engram layer 14 opens stage 1) with DSpark at K = 5 (the checkpoint's
dspark_block_size, as in the reference deployments), 13,14,13 (Engram 14 second on stage 1; stage 2
starts inside 20's sharing group), 20,20 (no replicas: every group on one stage) and PP8 5,5,5,5,5,5,6,4
(eight stages of 4-6 layers: Engram 14 last on stage 2, source 20 first on stage 4, every later stage a
replica holder; the aux layers 37-39 on the last stage, relayed from none).

`release_engines()` is the plan the runner's `plan()` returns for a checkpoint of RELEASE_LAYERS layers;
the runner runs and judges them as it does the 6-layer plan's (the oracle, the twins' tokens, the
drafter's inputs, the rows per stage, acceptance).
"""

from __future__ import annotations

import dataclasses

from deepinfer_sm80.testing.e2e.engines import (
    ASYNC,
    DECODE_ROWS,
    DSPARK_PP_ROWS,
    LEVELS,
    PP_ROWS,
    Case,
    Engine,
    base_engine_kwargs,
    concurrent_case,
    pp_engine,
)

RELEASE_LAYERS = 40  # the release's num_hidden_layers (scripts/tiny_v41_release.py)
# DSpark at the reference deployments' width: K = 5 draft tokens per step, the checkpoint's
# dspark_block_size (vLLM's default K for DSpark when none is given, config/speculative.py).
RELEASE_K = 5
RELEASE_DSPARK = {"method": "dspark", "num_speculative_tokens": RELEASE_K}
RELEASE_DSPARK_KWARGS = {"speculative_config": RELEASE_DSPARK, "disable_log_stats": False}
# vLLM's mp executor gives a step 300 s (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, envs.py); the 40-layer base
# level's first step with DSpark took longer than that on the shared 2-core machine ("RPC call to
# sample_tokens timed out"), so the pipeline engines here allow 30 minutes per step.
STEP_TIMEOUT = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800"}
# The release's cuts: (engine name, partition, DSpark, levels, what it proves)
RELEASE_CUTS: list[tuple[str, str, bool, tuple[str, ...], str]] = [
    ("release_pp3_14_14_12_dspark", "14,14,12", True, LEVELS,
     "the reference PP3 cut with DSpark K=5: Engram layer 14 (a ratio-2 kv + index source) opens stage 1; "
     "stage 2 (28-39) holds replicas of 20's compressed KV, indexer K and candidates for 28-39, and the "
     "aux layers 37-39"),
    ("release_pp3_13_14_13", "13,14,13", False, ("optimized",),
     "Engram layer 14 second on stage 1 (13-26), which replicates 8's compressed KV for 13; stage 2 starts "
     "at 27 inside 20's sharing group"),
    ("release_pp2_20_20", "20,20", False, ("optimized",),
     "the cut at the ratio boundary: every sharing group on one stage, no replicas"),
    ("release_pp8", "5,5,5,5,5,5,6,4", False, ("optimized",),
     "PP8: stage 0 (0-4) holds Engram 1 and source 2, stage 2 (10-14) ends with Engram 14, stage 4 (20-24) "
     "opens with source 20; every stage after a source's replicates its caches"),
]  # fmt: skip


def release_engines(short: list[int], every: list[str]) -> list[Engine]:
    """The single stage (± DSpark K=5) and the release's cuts, each serving the runner's short case; the
    single stages and the DSpark cut also the concurrent one (four requests in flight).

    `every`: the rows every forward reaches (the runner's EVERY_FORWARD + engram_lookup). The cuts
    without DSpark must give release_main's tokens; the DSpark ones release_main's tokens (greedy
    speculation is lossless) and release_dspark's drafter inputs."""
    from deepinfer_sm80.testing.e2e.models import SELECTING

    case = "12-token prompt on the release-structured checkpoint, 4 greedy tokens"
    engines = [
        Engine(
            "release_main",
            SELECTING,
            base_engine_kwargs(),
            [
                Case("short", [short], 4, {lv: every + DECODE_ROWS for lv in LEVELS}, case),
                concurrent_case(
                    {lv: every + DECODE_ROWS for lv in LEVELS}, " on the release-structured checkpoint"
                ),
            ],
        ),
        Engine(
            "release_dspark",
            SELECTING,
            base_engine_kwargs() | RELEASE_DSPARK_KWARGS,
            [
                Case(
                    "short",
                    [short],
                    4,
                    {lv: [*every, "dspark_draft"] for lv in LEVELS},
                    f"{case}, DSpark drafting {RELEASE_K} tokens per step",
                ),
                concurrent_case(
                    {lv: [*every, "dspark_draft"] for lv in LEVELS}, f" with DSpark K={RELEASE_K}"
                ),
            ],
            spec_of="release_main",
            env=dict(ASYNC),
        ),
    ]
    for name, partition, spec, levels, what in RELEASE_CUTS:
        # the concurrent case on the reference cut (with DSpark) at the DeepInfer level only: the base
        # level's interpreted kernels make four requests through three stages too slow for the evidence
        # run (the short case runs at both levels); the other cuts serve the short case
        what = f"pipeline parallel {partition}: {what}"
        e = pp_engine(name, partition, spec, short, every, what, levels, concurrent=spec)
        e = dataclasses.replace(
            e,
            cases=[
                c if c.name != "concurrent" else dataclasses.replace(c, levels=("optimized",))
                for c in e.cases
            ],
        )
        kwargs = dict(e.engine)
        if spec:
            kwargs |= RELEASE_DSPARK_KWARGS
            rows = every + DECODE_ROWS + PP_ROWS + DSPARK_PP_ROWS
            e = dataclasses.replace(e, cases=[dataclasses.replace(c, rows={lv: rows for lv in LEVELS})
                                              for c in e.cases])  # fmt: skip
        engines.append(
            dataclasses.replace(
                e,
                engine=kwargs,
                spec_of="release_main" if spec else None,
                same_as=None if spec else "release_main",
                aux_of="release_dspark" if spec else None,
                env=e.env | STEP_TIMEOUT,
            )
        )
    return engines
