"""Lightning indexer on the GPU: bitwise Q/K vs upstream's hardware-fp8 Triton kernels, logits vs upstream's
paths, then logits + top-k timed dense (base) vs streamed (DeepInfer) at 64K / 256K / 1M keys, with peak
workspace from torch.cuda.max_memory_allocated.

The GPU bundle has upstream's Python tree but no compiled ops (no vllm._C, no DeepGEMM), so the dense
baseline's top-k is torch.topk over the logits, standing in for top_k_per_row_prefill / the persistent
top-k; upstream's decode logits are its Triton kernel `_fp8_paged_mqa_logits_decode_kernel` (fp8 tl.dot,
runs on sm_89+); upstream's prefill logits exist only as the torch reference. The Q/K and logits checks
against upstream live in testing/cases/indexer.py (the op tests assert them too); this module times.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from deepinfer_sm80.formats.indexer_k import RECORD_BYTES
from deepinfer_sm80.ops.indexer import logits as lg
from deepinfer_sm80.ops.indexer import stream
from deepinfer_sm80.testing.bench import Ceilings, Row, Target, at_least, at_most, median_eager_us, time_graph
from deepinfer_sm80.testing.cases import indexer as cases

H, D, TOPK = cases.H, cases.D, 512
PREFILL_QUERIES = 8192
KEYS = (1 << 16, 1 << 18, 1 << 20)
DECODE_ROWS = (1, 8, 48)
WORKSPACE_GOAL_MB = 150.0
SLOWDOWN_GOAL = 1.10
MATMUL_FRACTION_GOAL = 0.40
DECODE_COPY_GOAL = 60.0
LOG: list[str] = []
DEVICE = "cuda"  # the CPU smoke run of the checks (interpreter) sets "cpu"


def say(msg: str) -> None:
    line = f"[indexer {time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    LOG.append(line)


def time_us(fn: Callable[[], object], reps: int = 5) -> float:
    """The shared eager timer at this bench's counts (one warm-up call, `reps` timed)."""
    return median_eager_us(fn, reps=reps)


def peak_bytes(fn: Callable[[], object]) -> int:
    """Bytes allocated by fn beyond what was live before it (its workspace and outputs)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def fast_codes(shape: tuple[int, ...]) -> torch.Tensor:
    """Random codes for timing only, with no temporaries: bit 3 cleared, so never a NaN code (0x7F/0xFF)."""
    return torch.empty(shape, dtype=torch.uint8, device=DEVICE).random_(0, 256).bitwise_and_(0xF7)


# ----------------------------------------------------------------------------- prefill timings
def prefill(ceilings: Ceilings, rows_out: list[Row], res: dict[str, object]) -> None:
    gen = torch.Generator(device=DEVICE).manual_seed(12)
    for n in KEYS:
        prefill_case(n, gen, rows_out, res)


def prefill_case(n: int, gen: torch.Generator, rows_out: list[Row], res: dict[str, object]) -> None:
    m = PREFILL_QUERIES
    k8 = fast_codes((n, D))
    ks = torch.exp2(torch.randint(-10, -6, (n,), generator=gen, device=DEVICE).float())
    q8 = fast_codes((m, H, D))
    w = torch.randn(m, H, generator=gen, device=DEVICE) * 2.0**-6
    kst = torch.zeros(m, dtype=torch.int32, device=DEVICE)
    ket = torch.full((m,), n, dtype=torch.int32, device=DEVICE)
    label = f"{n >> 10}K"
    flops = 2.0 * m * H * n * D
    idx = torch.empty((m, TOPK), dtype=torch.int32, device=DEVICE)

    def run_stream() -> None:
        stream.indexer_topk_prefill(q8, w, k8, ks, kst, ket, idx)

    reps = 3 if n <= (1 << 18) else 1
    t_stream = time_us(run_stream, reps=reps)
    ws_stream = peak_bytes(run_stream)
    rows_out.append(
        Row("indexer_prefill_topk", "deepinfer", f"q{m}", n, round(t_stream, 1), None, None, None, "n/a")
    )
    entry: dict[str, object] = {
        "stream_us": round(t_stream, 1),
        "stream_workspace_mb": round(ws_stream / 2**20, 1),
    }
    dense_m = m if n <= (1 << 18) else 2048  # a dense [8192, 1M] fp32 matrix alone is 32 GiB
    qd, wd = q8[:dense_m], w[:dense_m]
    kd, ked = kst[:dense_m], ket[:dense_m]

    def run_logits() -> torch.Tensor:
        return lg.fp8_fp4_mqa_logits((qd, None), (k8, ks), wd, kd, ked, False)

    def run_dense() -> torch.Tensor:
        return torch.topk(run_logits(), TOPK, dim=1).indices

    t_logits = time_us(run_logits, reps=reps)
    t_dense = time_us(run_dense, reps=reps)
    ws_dense = peak_bytes(run_dense)
    tflops = 2.0 * dense_m * H * n * D / (t_logits * 1e-6) / 1e12
    entry.update(
        dense_queries=dense_m,
        dense_logits_us=round(t_logits, 1),
        dense_topk_total_us=round(t_dense, 1),
        dense_workspace_mb=round(ws_dense / 2**20, 1),
        logits_tflops=round(tflops, 1),
        stream_tflops_incl_topk=round(flops / (t_stream * 1e-6) / 1e12, 1),
    )
    rows_out.append(
        Row(
            "indexer_prefill_logits",
            "base",
            f"q{dense_m}",
            n,
            round(t_logits, 1),
            None,
            None,
            None,
            "n/a",
        )
    )
    rows_out.append(
        Row("indexer_prefill_topk", "base", f"q{dense_m}", n, round(t_dense, 1), None, None, None, "n/a")
    )
    if dense_m == m:
        dense_idx = run_dense()
        run_stream()
        same = sum(
            set(a) == set(b) for a, b in zip(idx[:256].tolist(), dense_idx[:256].tolist(), strict=True)
        )
        entry["rows_same_set_of_256"] = same
    if n == KEYS[0]:  # the merge mode and chunk knobs (stream.PREFILL_SELECT, CHUNK_MAX)
        for sel_mode, cmax in (("fp32", stream.CHUNK_MAX), ("int64", 8192), ("fp32", 8192)):

            def run_variant() -> None:
                stream.indexer_topk_prefill(q8, w, k8, ks, kst, ket, idx, select=sel_mode, chunk_max=cmax)  # noqa: B023

            tag = f"stream_{sel_mode}_chunk{cmax >> 10}k"
            entry[f"{tag}_us"] = round(time_us(run_variant, reps=2), 1)
            entry[f"{tag}_workspace_mb"] = round(peak_bytes(run_variant) / 2**20, 1)
        cand = torch.empty((m, 2048), dtype=torch.int32, device=DEVICE)

        def run_write() -> None:  # layer 20: its top-k and its 2048 candidate blocks
            stream.indexer_topk_prefill(
                q8, w, k8, ks, kst, ket, idx, candidate_blocks=cand, candidate_write=True
            )

        def run_read() -> None:  # layers 24..36: only the 16384 candidate columns
            stream.indexer_topk_prefill(q8, w, k8, ks, kst, ket, idx, candidate_blocks=cand)

        entry["candidate_write_us"] = round(time_us(run_write, reps=2), 1)
        entry["candidate_write_workspace_mb"] = round(peak_bytes(run_write) / 2**20, 1)
        entry["candidate_only_us"] = round(time_us(run_read, reps=3), 1)
        entry["candidate_only_workspace_mb"] = round(peak_bytes(run_read) / 2**20, 1)
        rows_out.append(
            Row(
                "indexer_prefill_cand_write",
                "deepinfer",
                f"q{m}",
                n,
                entry["candidate_write_us"],
                None,
                None,
                None,
                "n/a",
            )
        )  # type: ignore[arg-type]
        rows_out.append(
            Row(
                "indexer_prefill_cand_only",
                "deepinfer",
                f"q{m}",
                n,
                entry["candidate_only_us"],
                None,
                None,
                None,
                "n/a",
            )
        )  # type: ignore[arg-type]
    res[f"prefill_{label}"] = entry
    say(f"prefill {label}: {entry}")
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- decode timings
def decode(ceilings: Ceilings, rows_out: list[Row], res: dict[str, object]) -> None:
    gen = torch.Generator(device=DEVICE).manual_seed(13)
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import _fp8_paged_mqa_logits_decode_kernel

    for ctx in KEYS:
        pool, bt = cases.paged_pool(max(DECODE_ROWS), ctx, 128, gen, device=DEVICE)
        pool_up, bt_up = (
            cases.paged_pool(max(DECODE_ROWS), ctx, 128, gen, padded=False, device=DEVICE)
            if ctx <= (1 << 18)
            else (None, None)
        )
        for r in DECODE_ROWS:
            decode_case(
                ctx,
                r,
                pool,
                bt,
                pool_up,
                bt_up,
                gen,
                ceilings,
                rows_out,
                res,
                _fp8_paged_mqa_logits_decode_kernel,
            )
        torch.cuda.empty_cache()


def decode_case(
    ctx: int,
    r: int,
    pool: torch.Tensor,
    bt: torch.Tensor,
    pool_up: torch.Tensor | None,
    bt_up: torch.Tensor | None,
    gen: torch.Generator,
    ceilings: Ceilings,
    rows_out: list[Row],
    res: dict[str, object],
    kernel: object,
) -> None:
    q4 = cases.codes((r, 1, H, D), gen, DEVICE)
    w = torch.randn(r, H, generator=gen, device=DEVICE) * 2.0**-6
    lens = torch.full((r,), ctx, dtype=torch.int32, device=DEVICE)
    # input sets of distinct pages, rotated per call so no call reads what the last left in L2
    sets = [bt[j * r : (j + 1) * r].contiguous() for j in range(max(DECODE_ROWS) // r)]
    idx = torch.empty((r, TOPK), dtype=torch.int32, device=DEVICE)
    kbytes = r * ctx * RECORD_BYTES

    def run_logits(i: int = 0) -> torch.Tensor:
        return lg.fp8_fp4_paged_mqa_logits((q4, None), pool, w, lens, sets[i % len(sets)], None, ctx, False)

    def run_dense(i: int = 0) -> torch.Tensor:
        return torch.topk(run_logits(i), TOPK, dim=1).indices

    def run_stream(i: int = 0) -> None:
        stream.indexer_topk_decode(q4, w, pool, lens, sets[i % len(sets)], ctx, idx)

    n_sets = len(sets)
    t_l = statistics.median(time_graph(run_logits, n_sets, replays=10))
    t_d = statistics.median(time_graph(run_dense, n_sets, replays=5))
    t_s = statistics.median(time_graph(run_stream, n_sets, replays=5))
    pct = 100 * kbytes / (t_l * 1e3) / ceilings.copy_gbps
    entry: dict[str, object] = {
        "logits_us": round(t_l, 1),
        "logits_pct_of_copy": round(pct, 1),
        "dense_topk_us": round(t_d, 1),
        "stream_us": round(t_s, 1),
        "dense_workspace_mb": round(peak_bytes(run_dense) / 2**20, 1),
        "stream_workspace_mb": round(peak_bytes(run_stream) / 2**20, 1),
        "timing": "CUDA graph, rotated page sets",
    }
    if pool_up is not None:
        up_sets = [bt_up[j * r : (j + 1) * r].contiguous() for j in range(n_sets)]

        def run_up(i: int = 0) -> torch.Tensor:
            return cases.upstream_paged(kernel, q4, pool_up, w, lens, up_sets[i % n_sets], ctx, DEVICE)

        t_u = statistics.median(time_graph(run_up, n_sets, replays=10))
        entry["upstream_triton_fp8_logits_us"] = round(t_u, 1)
        rows_out.append(
            Row(
                "indexer_decode_logits",
                "upstream",
                f"r{r}",
                ctx,
                round(t_u, 1),
                round(kbytes / (t_u * 1e3), 1),
                round(100 * kbytes / (t_u * 1e3) / ceilings.copy_gbps, 1),
                None,
                "close",
            )
        )
    # the opt-in paged-decode variants (DEEPINFER_SM80_INDEXER_DECODE), read at capture: same sets
    ref_out = run_logits(0)
    for variant in lg.DECODE_VARIANTS:
        if variant == "default":
            continue
        os.environ[lg.DECODE_VARIANT_ENV] = variant
        try:
            t_v = statistics.median(time_graph(run_logits, n_sets, replays=10))
            same = bool(torch.equal(run_logits(0), ref_out))
        finally:
            os.environ.pop(lg.DECODE_VARIANT_ENV, None)
        entry[f"logits_us_{variant}"] = round(t_v, 1)
        entry[f"logits_pct_of_copy_{variant}"] = round(100 * kbytes / (t_v * 1e3) / ceilings.copy_gbps, 1)
        entry[f"logits_bitwise_{variant}"] = same
    if r == max(DECODE_ROWS):  # the other paged K decode (logits.PAGED_WORD_DECODE)
        lg.PAGED_WORD_DECODE = not lg.PAGED_WORD_DECODE
        try:
            other = statistics.median(time_graph(run_logits, n_sets, replays=10))
        finally:
            lg.PAGED_WORD_DECODE = not lg.PAGED_WORD_DECODE
        entry["logits_us_word_decode" if not lg.PAGED_WORD_DECODE else "logits_us_byte_decode"] = round(
            other, 1
        )
    if r == 8:
        dense_idx = run_dense(0)
        run_stream(0)
        entry["rows_same_set"] = sum(
            set(a) == set(b) for a, b in zip(idx.tolist(), dense_idx.tolist(), strict=True)
        )
    gb = kbytes / (t_l * 1e3)
    rows_out.append(
        Row(
            "indexer_decode_logits",
            "base",
            f"r{r}",
            ctx,
            round(t_l, 1),
            round(gb, 1),
            round(pct, 1),
            None,
            "close",
        )
    )
    rows_out.append(Row("indexer_decode_topk", "base", f"r{r}", ctx, round(t_d, 1), None, None, None, "n/a"))
    rows_out.append(
        Row("indexer_decode_topk", "deepinfer", f"r{r}", ctx, round(t_s, 1), None, None, None, "n/a")
    )
    if ctx == KEYS[0] and r == 8:
        entry["graph_replay_equal"] = graph_check(run_stream, idx)
    res[f"decode_{ctx >> 10}K_r{r}"] = entry
    say(f"decode {ctx >> 10}K rows {r}: {entry}")


def graph_check(run: Callable[[], None], out: torch.Tensor) -> bool:
    """Capture the streamed decode in a CUDA graph, replay it, compare with an eager call."""
    run()
    eager = out.clone()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
        with torch.cuda.graph(graph, stream=side):
            run()
    torch.cuda.current_stream().wait_stream(side)
    out.fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    return bool(torch.equal(out, eager))


def matmul_ceiling(res: dict[str, object]) -> float:
    a = torch.randn(32768, D, device=DEVICE).bfloat16()
    b = torch.randn(D, 16384, device=DEVICE).bfloat16()
    t = time_us(lambda: torch.matmul(a, b), reps=10)
    comparable = 2.0 * 32768 * D * 16384 / (t * 1e-6) / 1e12
    sq = torch.randn(8192, 8192, device=DEVICE).bfloat16()
    t2 = time_us(lambda: torch.matmul(sq, sq), reps=5)
    res["matmul_bf16_k128_tflops"] = round(comparable, 1)
    res["matmul_bf16_8192cube_tflops"] = round(2.0 * 8192**3 / (t2 * 1e-6) / 1e12, 1)
    say(
        f"matmul: {res['matmul_bf16_k128_tflops']} TFLOPS at [32768,128]x[128,16384], "
        f"{res['matmul_bf16_8192cube_tflops']} at 8192^3"
    )
    return comparable


def targets(res: dict[str, object]) -> list[Target]:
    out: list[Target] = []
    p1m = res.get("prefill_1024K")
    if isinstance(p1m, dict):
        out.append(
            at_most(
                "prefill workspace at 1M keys, 8192 queries (streamed)",
                float(p1m["stream_workspace_mb"]),
                WORKSPACE_GOAL_MB,
                "MB",
                cause="torch.topk temporaries on the [R, 512 + C] key buffer",
            )
        )
        # our work is the streamed workspace; the dense one is the baseline it replaces, so the target is
        # the saving (dense / streamed), its goal the ratio of the two issue goals (5 GB dense vs 150 MB)
        out.append(
            at_least(
                "prefill workspace saving at 1M keys: dense / streamed",
                float(p1m["dense_workspace_mb"]) / float(p1m["stream_workspace_mb"]),
                round(5.0 * 1024 / WORKSPACE_GOAL_MB, 1),
                "x",
                cause="streamed temporaries grew (see stream_workspace_mb)",
            )
        )
    p64 = res.get("prefill_64K")
    if isinstance(p64, dict):
        ratio = float(p64["stream_us"]) / float(p64["dense_topk_total_us"])
        out.append(
            at_most(
                "prefill streamed / dense time at 64K keys",
                ratio,
                SLOWDOWN_GOAL,
                "x",
                cause="per-row-block torch.topk merges (see the stream_* variants in results)",
            )
        )
    mm = res.get("matmul_bf16_k128_tflops")
    best = max(
        (
            float(v["logits_tflops"])
            for k, v in res.items()
            if k.startswith("prefill_") and isinstance(v, dict)
        ),
        default=0.0,
    )
    if mm:
        out.append(
            at_least(
                "prefill logits TFLOPS / torch.matmul bf16 (K=128)",
                best / float(mm),
                MATMUL_FRACTION_GOAL,
                "x",
                cause="software e4m3 decode and the head-sum epilogue share the SM with the MMA",
            )
        )
    dec = [
        v for k, v in res.items() if k.startswith("decode_") and isinstance(v, dict) and k.endswith("_r48")
    ]
    if dec:
        out.append(
            at_least(
                "decode logits % of copy bandwidth on K bytes (48 rows, best ctx)",
                max(float(v["logits_pct_of_copy"]) for v in dec),
                DECODE_COPY_GOAL,
                "% of copy",
                cause="software e4m3 decode (compare upstream_triton_fp8_logits_us)",
            )
        )
    q = res.get("quant")
    if isinstance(q, dict):
        diff = sum(int(v) for k, v in q.items() if k.endswith("differ"))
        out.append(at_most("Q/K bytes differing from upstream's hardware-fp8 kernels", diff, 0, "bytes"))
    return out


def main(out_dir: Path, ceilings: Ceilings) -> dict[str, object]:
    res: dict[str, object] = {}
    rows: list[Row] = []
    # DEEPINFER_BENCH_INDEXER_SECTIONS=decode,prefill (comma list) runs only those sections
    wanted = os.environ.get("DEEPINFER_BENCH_INDEXER_SECTIONS", "")
    for name, fn in (
        ("quant", lambda: cases.upstream_quant_bytes(DEVICE, say)),
        ("logits_check", lambda: cases.upstream_logits(DEVICE, say)),
        ("matmul", lambda: matmul_ceiling(res)),
        ("decode", lambda: decode(ceilings, rows, res)),
        ("prefill", lambda: prefill(ceilings, rows, res)),
    ):
        if wanted and name not in wanted.split(","):
            continue
        start = time.time()
        try:
            value = fn()
            if isinstance(value, dict):
                res[name] = value
        except Exception as exc:  # keep the other sections' numbers
            res[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
            say(f"{name} FAILED: {traceback.format_exc()[-1500:]}")
        say(f"section {name}: {time.time() - start:.1f} s")
        partial = {"rows": [r.as_dict() for r in rows], **res, "log": LOG}
        (out_dir / "indexer-partial.json").write_text(json.dumps(partial, indent=1, default=str) + "\n")
    (out_dir / "indexer-partial.json").unlink(missing_ok=True)
    res["log"] = LOG
    res["note"] = (
        "H200 with torch 2.11 / triton 3.6 (not our pins); "
        "dense top-k = torch.topk (no vllm._C in the bundle)"
    )
    return {"rows": [r.as_dict() for r in rows], "targets": [t.as_dict() for t in targets(res)], **res}
