"""DSpark draft step on the GPU: bitwise against upstream vLLM 0.32.0's chain and sampler, then timed.

Upstream's chain is `DSparkSpeculator._sample_sequential` itself, run on a stand-in speculator whose
model hooks are the draft model's eager ops (embedding, bf16 linear); its sampler is upstream's own
`gumbel_sample` (Triton) or `torch.argmax`. Each draft position moves the Markov head once
(V x 256 bf16 = 66 MB at V = 129,280), so one position is bounded below by that read.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from deepinfer_sm80.integration import dspark_draft as wiring
from deepinfer_sm80.ops import dspark_draft as dd
from deepinfer_sm80.ops.dspark_draft import chain
from deepinfer_sm80.testing.bench import (
    Ceilings,
    Row,
    Target,
    at_least,
    format_line,
    summarize,
    time_eager,
    time_graph,
)
from deepinfer_sm80.testing.cases.dspark_draft import stand_in
from deepinfer_sm80.testing.compare import MismatchError, assert_bitwise_equal
from deepinfer_sm80.testing.inputs import DRAFT_KINDS, DraftInputs, draft_inputs, generator
from deepinfer_sm80.testing.shapes import TP_DEGREES, V41

BATCHES = (1, 4, 8, 16)
MODES = ("greedy", "gumbel")
DEVICE = "cuda"
ENV_QUICK = "DEEPINFER_BENCH_DSPARK_QUICK"  # "1": per-step sweep at TP1 only (the chain and checks in full)
# scripts/h200_final.sh runs this bench in its phase 1 (quick mode fits the short lease; no TileLang)
H200_FINAL_PHASE = 1


# ----------------------------------------------------------------------------- upstream stand-in
class OpChain:
    """Upstream's `_sample_sequential` op sequence, for a GPU box where the speculator module does not
    import (the bench records which one ran): Markov row, bias GEMM, add, upstream's sampler, store."""

    gumbel_sample: Callable[..., torch.Tensor]

    @staticmethod
    def _sample_logits(*_: object) -> None:
        raise NotImplementedError

    @staticmethod
    def _maybe_predict_acceptance(*_: object) -> None:
        return None

    @classmethod
    def _sample_sequential(cls, spec: Any, num_reqs: int, head_hidden: torch.Tensor) -> None:
        k = spec.num_speculative_steps
        base = spec.model.compute_draft_logits(head_hidden[spec.sample_indices[: num_reqs * k]])
        base = base.view(num_reqs, k, -1)
        idx_map = spec.sample_idx_mapping[: num_reqs * k].view(num_reqs, k)
        pos = spec.sample_pos[: num_reqs * k].view(num_reqs, k)
        prev = spec.input_buffers.input_ids[spec._anchor_idx[:num_reqs]]
        for i in range(k):
            logits = base[:, i] + spec.model.markov_bias(spec.model.markov_embed(prev))
            if spec.draft_logits is None:
                prev = logits.argmax(dim=-1)
            else:
                prev = cls.gumbel_sample(
                    logits,
                    idx_map[:, i],
                    spec.temperature,
                    spec.seeds,
                    pos[:, i] - 1,
                    apply_temperature=True,
                    is_drafting=True,
                    logits_cache=spec.draft_logits,
                    logits_cache_col=spec._step_cols[i],
                )
            spec.draft_tokens[:num_reqs, i] = prev


def in_kernel_bias_study(ceilings: Ceilings) -> dict[str, Any]:
    """Can the bias GEMM move inside the draft kernel bitwise? Compare a tl.dot bias with cuBLAS's."""
    R, V = V41.markov_rank, V41.vocab
    gen = generator("bench-dspark-bias-study", DEVICE)
    w2 = (torch.randn(V, R, generator=gen, device=DEVICE) * 0.05).bfloat16()
    out: dict[str, Any] = {}
    for B in BATCHES:
        e = (torch.randn(B, R, generator=gen, device=DEVICE) * 0.5).bfloat16()
        ref, ours = F.linear(e, w2), chain.markov_bias(e, w2)
        differ = int((ref.view(torch.int16) != ours.view(torch.int16)).sum())
        gemm = summarize(
            "cublas", time_graph(lambda _, e=e: F.linear(e, w2), 1, calls=4, replays=10), 2 * V * R, ceilings
        )
        probe = summarize(
            "tl.dot",
            time_graph(lambda _, e=e: chain.markov_bias(e, w2), 1, calls=4, replays=10),
            2 * V * R,
            ceilings,
        )
        out[f"B={B}"] = {
            "elements_differing_from_cublas": differ,
            "elements": B * V,
            "cublas_graph_us": gemm.us,
            "tl_dot_graph_us": probe.us,
            "head_read_floor_us": round(ceilings.floor_us(2 * V * R), 3),
        }
        print(
            f"in-kernel bias B={B}: {differ} of {B * V} bf16 values differ from cuBLAS"
            f" | cuBLAS {gemm.us} us, tl.dot {probe.us} us"
        )
    return out


# ----------------------------------------------------------------------------- one position, any shard
def step_fns(
    inp: DraftInputs, gumbel: bool, gumbel_sample: Callable[..., torch.Tensor], whole: bool
) -> tuple[Callable[[], None], Callable[[], None]]:
    """(upstream, ours) callables for position 1: Markov row -> bias GEMM -> add -> sample -> token."""
    b, k, v = inp.base_logits.shape
    prev = inp.anchor.clone()
    tokens = torch.empty(b, k, dtype=torch.long, device=DEVICE)
    cache = torch.zeros(inp.temperature.shape[0], k, v, dtype=inp.base_logits.dtype, device=DEVICE)
    col = torch.tensor(1, dtype=torch.int32, device=DEVICE)
    rows = F.embedding(prev, inp.markov_w1)
    scratch = dd.DraftScratch.allocate(b, v, DEVICE)
    best = torch.empty(b, dtype=torch.float32, device=DEVICE)

    def upstream() -> None:
        logits = inp.base_logits[:, 1] + F.linear(F.embedding(prev, inp.markov_w1), inp.markov_w2)
        if gumbel:
            tok = gumbel_sample(
                logits,
                inp.idx_map[:, 1],
                inp.temperature,
                inp.seeds,
                inp.sample_pos[:, 1] - 1,
                apply_temperature=True,
                is_drafting=True,
                logits_cache=cache,
                logits_cache_col=col,
            )
        else:
            tok = logits.argmax(dim=-1)
        tokens[:, 1] = tok

    def ours() -> None:
        dd.draft_step(
            inp.base_logits[:, 1],
            F.linear(rows, inp.markov_w2),
            tokens[:, 1],
            scratch,
            gumbel=gumbel,
            idx_map=inp.idx_map[:, 1] if gumbel else None,
            temperature=inp.temperature if gumbel else None,
            seeds=inp.seeds if gumbel else None,
            sample_pos=inp.sample_pos[:, 1] if gumbel else None,
            logits_cache=cache if gumbel else None,
            cache_col=1,
            markov_w1=inp.markov_w1 if whole else None,
            row_out=rows if whole else None,
            best_out=None if whole else best,
        )

    return upstream, ours


def chain_fns(cls: Any, inp: DraftInputs, gumbel: bool) -> dict[str, Callable[[], object]]:
    """All K positions: upstream's `_sample_sequential`, our wiring (one launch), our per-step path."""
    b = inp.base_logits.shape[0]
    theirs, hidden = stand_in(cls, inp, gumbel)
    mine, hidden2 = stand_in(cls, inp, gumbel)
    step, hidden3 = stand_in(cls, inp, gumbel)
    return {
        "upstream": lambda: cls._sample_sequential(theirs, b, hidden),
        "one-launch": lambda: wiring.sample_sequential(mine, b, hidden2, one_launch=True),
        "per-step": lambda: wiring.sample_sequential(step, b, hidden3, one_launch=False),
    }


def check_chain(cls: Any, inp: DraftInputs, gumbel: bool, per_step: bool = False) -> str:
    theirs, hidden = stand_in(cls, inp, gumbel)
    cls._sample_sequential(theirs, inp.base_logits.shape[0], hidden)
    mine, hidden2 = stand_in(cls, inp, gumbel)
    try:
        if not wiring.sample_sequential(mine, inp.base_logits.shape[0], hidden2, one_launch=not per_step):
            return f"fell back: {wiring.unsupported(mine, hidden2)}"
        path = getattr(mine, wiring.PATH_ATTR)
        held = getattr(mine, wiring._CHAIN_ATTR, None)
        if path == "chain" and held is not None and int(held[0].sync[2]) != 0:
            return "grid barrier timed out (programs not all resident)"
        assert_bitwise_equal(f"{path} draft tokens", mine.draft_tokens, theirs.draft_tokens)
        if gumbel:
            assert_bitwise_equal(f"{path} draft logits cache", mine.draft_logits, theirs.draft_logits)
    except MismatchError as e:
        print(f"MISMATCH {e}")
        return str(e)
    return "ok" if path == ("step" if per_step else "chain") else f"ran the {path} path"


def count_kernels(fn: Callable[[], object]) -> int | None:
    """CUDA kernels one call launches (profiler), None where the profiler cannot see the GPU."""
    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return sum(1 for e in kernels if "memcpy" not in e.name.lower() and "memset" not in e.name.lower())
    except Exception as e:
        print(f"kernel count unavailable: {e}")
        return None


def timed(label: str, fn: Callable[[], object], nbytes: int, ceilings: Ceilings) -> dict[str, Any]:
    eager = summarize(f"{label} eager", time_eager(lambda _: fn(), 1, reps=30), nbytes, ceilings)
    graph = summarize(f"{label} graph", time_graph(lambda _: fn(), 1, calls=4, replays=10), nbytes, ceilings)
    print(format_line(eager))
    print(format_line(graph))
    return {"eager": eager, "graph": graph}


def main(out_dir: Path, ceilings: Ceilings) -> dict[str, object]:
    from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample

    cls: Any
    try:
        from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator as cls

        chain_source = "vllm 0.32.0 DSparkSpeculator._sample_sequential"
    except Exception as e:
        OpChain.gumbel_sample = staticmethod(gumbel_sample)
        cls, chain_source = OpChain, f"OpChain replica, speculator import failed: {type(e).__name__}: {e}"
    print(f"upstream chain: {chain_source}")
    R, K = V41.markov_rank, V41.draft_tokens
    rows: list[Row] = []
    results: dict[str, Any] = {
        "upstream_chain": chain_source,
        "edge_cases_bitwise": {},
        "steps": [],
        "chains": [],
    }
    results["in_kernel_bias"] = in_kernel_bias_study(ceilings)
    # bitwise: every input kind through the whole chain at B = 8, V = 129,280
    for kind in DRAFT_KINDS:
        inp = draft_inputs(kind, 8, K, V41.vocab, R, generator(f"bench-dspark-{kind}", DEVICE), device=DEVICE)
        for mode in MODES:
            for path in ("one-launch", "per-step"):
                verdict = check_chain(cls, inp, mode == "gumbel", per_step=path == "per-step")
                results["edge_cases_bitwise"][f"{kind} {mode} {path}"] = verdict
    edges_ok = sum(v == "ok" for v in results["edge_cases_bitwise"].values())
    print(f"chain edge cases bitwise vs upstream: {edges_ok}/{len(results['edge_cases_bitwise'])} ok")

    launches: dict[str, int | None] = {}
    for tp in TP_DEGREES if os.environ.get(ENV_QUICK) != "1" else (1,):
        vocab = V41.per_rank(tp).lm_head_shard
        head_bytes = 2 * vocab * R
        for B in BATCHES:
            inp = draft_inputs(
                "random", B, K, vocab, R, generator(f"bench-dspark-{tp}-{B}", DEVICE), device=DEVICE
            )
            for mode in MODES:
                gumbel = mode == "gumbel"
                up, ours = step_fns(inp, gumbel, gumbel_sample, whole=tp == 1)
                nbytes = head_bytes + B * vocab * 2 * (3 if gumbel else 2)  # head + base + bias (+ cache)
                shape = f"step-{mode}-tp{tp}"
                t_up = timed(f"dspark {shape} B={B} upstream", up, nbytes, ceilings)
                t_ours = timed(f"dspark {shape} B={B} deepinfer", ours, nbytes, ceilings)
                gemm = summarize(
                    "gemm",
                    time_graph(
                        lambda _, e=inp.markov_w1[:B], w=inp.markov_w2: F.linear(e, w), 1, calls=4, replays=10
                    ),
                    head_bytes,
                    ceilings,
                )
                if B == 8 and tp == 1:
                    launches[f"upstream {mode} step"] = count_kernels(up)
                    launches[f"deepinfer {mode} step"] = count_kernels(ours)
                    launches["bias gemm"] = count_kernels(
                        lambda e=inp.markov_w1[:B], w=inp.markov_w2: F.linear(e, w)
                    )
                for impl, t in (("upstream", t_up), ("deepinfer", t_ours)):
                    for how in ("eager", "graph"):
                        rows.append(Row.from_timing("dspark_draft", impl, f"{shape}-{how}", B, t[how], "n/a"))
                results["steps"].append(
                    {
                        "tp": tp,
                        "vocab": vocab,
                        "B": B,
                        "mode": mode,
                        "bytes": nbytes,
                        "bias_gemm_graph_us": gemm.us,
                        **{
                            f"{impl}_{how}_us": t[how].us
                            for impl, t in (("upstream", t_up), ("deepinfer", t_ours))
                            for how in ("eager", "graph")
                        },
                    }
                )
    for B in BATCHES:
        inp = draft_inputs(
            "random", B, K, V41.vocab, R, generator(f"bench-dspark-chain-{B}", DEVICE), device=DEVICE
        )
        for mode in MODES:
            gumbel = mode == "gumbel"
            verdicts = {
                p: check_chain(cls, inp, gumbel, per_step=p == "per-step") for p in ("one-launch", "per-step")
            }
            fns = chain_fns(cls, inp, gumbel)
            if verdicts["one-launch"] != "ok":  # never time a path that did not run or did not finish
                del fns["one-launch"]
            nbytes = K * (2 * V41.vocab * R + B * V41.vocab * 2 * (3 if gumbel else 2))
            t = {
                name: timed(f"dspark chain-{mode} K={K} B={B} {name}", fn, nbytes, ceilings)
                for name, fn in fns.items()
            }
            for name, shape in (("upstream", ""), ("one-launch", ""), ("per-step", "-perstep")):
                if name not in t:
                    continue
                impl = "upstream" if name == "upstream" else "deepinfer"
                v = "n/a" if name == "upstream" else ("bitwise" if verdicts[name] == "ok" else "mismatch")
                for how in ("eager", "graph"):
                    rows.append(
                        Row.from_timing(
                            "dspark_draft", impl, f"chain{K}-{mode}{shape}-{how}", B, t[name][how], v
                        )
                    )
            if B == 8:
                for name, fn in fns.items():
                    launches[f"{name} {mode} chain"] = count_kernels(fn)
            results["chains"].append(
                {
                    "B": B,
                    "mode": mode,
                    "K": K,
                    "bytes": nbytes,
                    **{f"bitwise_{p}": v for p, v in verdicts.items()},
                    **{f"{name}_{how}_us": t[name][how].us for name in fns for how in ("eager", "graph")},
                }
            )
    results["kernel_launches"] = launches
    print(f"kernel launches: {launches}")
    return {"rows": [r.as_dict() for r in rows], "targets": targets(results, launches), **results}


GRAPH_SPEEDUP_GOAL = 1.05


def _speedup(results: dict[str, Any], kind: str, B: int, how: str, mode: str, ours: str) -> tuple[float, str]:
    """Mean upstream/ours time ratio, and the measured times as the cause line of a miss."""
    entries = [e for e in results[kind] if e["B"] == B and e["mode"] == mode and e.get("tp", 1) == 1]
    entries = [e for e in entries if f"{ours}_{how}_us" in e]
    if not entries:
        return 0.0, f"{ours} did not run (see bitwise_{ours} in chains[])"
    up = statistics.fmean(e[f"upstream_{how}_us"] for e in entries)
    mine = statistics.fmean(e[f"{ours}_{how}_us"] for e in entries)
    return up / mine, f"{how}: ours {mine:.1f} us vs upstream {up:.1f} us"


def targets(results: dict[str, Any], launches: dict[str, int | None]) -> list[dict[str, object]]:
    out: list[Target] = []
    for mode in MODES:
        chain_launches = launches.get(f"one-launch {mode} chain")
        ours_step, gemm = launches.get(f"deepinfer {mode} step"), launches.get("bias gemm")
        if chain_launches is not None:
            # the chain call also runs the head_hidden row gather that upstream runs too (1 kernel)
            per_pos = (chain_launches - 1) / V41.draft_tokens
            out.append(
                Target(
                    f"kernel launches per draft position, one-launch path ({mode})",
                    per_pos,
                    1,
                    "launches",
                    per_pos <= 1,
                    direction="<=",
                )
            )
        if ours_step is not None and gemm is not None:
            out.append(
                Target(
                    f"sampler launches per draft position besides the bias GEMM, per-step path ({mode})",
                    ours_step - gemm,
                    1,
                    "launches",
                    ours_step - gemm <= 1,
                    direction="<=",
                )
            )
        # graph: a gain counts from 5 % (a graph removes the launch overhead the eager goal is about, so
        # what remains is kernel time; 1.0001 would call a 0.3 % difference "faster")
        for how, goal in (("eager", 3.0), ("graph", GRAPH_SPEEDUP_GOAL)):
            for kind, ours, what in (
                ("chains", "one-launch", "all K=5 positions, one launch"),
                ("chains", "per-step", "all K=5 positions, per-step path"),
                ("steps", "deepinfer", "one draft position, per-step kernel"),
            ):
                ratio, cause = _speedup(results, kind, 8, how, mode, ours)
                out.append(
                    at_least(f"{what}, B=8 {mode} {how}: speedup vs upstream", ratio, goal, "x", cause)
                )
    verdicts = list(results["edge_cases_bitwise"].values()) + [
        v for c in results["chains"] for k, v in c.items() if k.startswith("bitwise_")
    ]
    bad = sum(v != "ok" for v in verdicts)
    out.append(
        Target("chain cases not bitwise vs upstream (both paths)", bad, 0, "cases", bad == 0, direction="<=")
    )
    return [t.as_dict() for t in out]
