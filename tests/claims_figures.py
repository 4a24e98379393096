# ruff: noqa: E501
"""Every figure typed in prose outside a rendered region, with the source that holds it (issue 39).

One entry per figure as written, per document, per sentence: `Figure(doc, figure, where, source)`;
`where` is a few words of its sentence (or "*": every occurrence of that figure in that document, for
a figure that means one thing throughout, such as a compute capability or a pinned version). The
kinds of source and how each is checked: tests/figure_sources.py. tests/test_claims.py fails on a
figure in prose that neither a rendered region (`make report`) nor an entry here holds, and on an
entry whose source disagrees with it or whose sentence is gone.

Figures typed before issue 39 and not yet sourced stay in tests/claims_figures_legacy.txt, exact
counts, at most LEGACY_CEILING in all: the list only shrinks.
"""

from __future__ import annotations

from figure_sources import Calc, Call, Code, Const, Defined, Figure, Json, Quoted, Text

LEGACY_CEILING = 0  # every figure is rendered or sourced (issue 39): the legacy list stays empty

PINS = "docker/versions.env"
TABLE = "overlay/deepinfer_sm80/table.py"
TOPOLOGY = "overlay/deepinfer_sm80/integration/pp/topology.py"


def pin(name: str) -> Text:
    """A pinned version as major.minor (docker/versions.env, the one pin file)."""
    return Text(PINS, rf"^{name}=(\d+\.\d+)")


# compute capabilities: the image's arch list (8.0, 8.6) and the table's two thresholds (8.9, 9.0)
CAPABILITY = {
    "8.0": Text(PINS, r"^TORCH_CUDA_ARCH_LIST=(8\.0)\b"),
    "8.6": Text(PINS, r"^TORCH_CUDA_ARCH_LIST=\S+ (8\.6)\b"),
    "8.9": Const(f"{TABLE}:HW_FP8_CAPABILITY", scale=10),
    "9.0": Const(f"{TABLE}:NO_FLASHMLA_CAPABILITY", scale=10),
}
# the H200 host of the device calls (not the pins): its own record
H200_TORCH = Json("gpu/patches-h200.json", "provenance.versions.torch")
H200_TRITON = Json("gpu/patches-h200.json", "provenance.versions.triton")
# one page of the 584-byte V4 record, rounded to 576 B (topology.py, FP8_DS_MLA.md)
RECORD, ALIGN = Const(f"{TOPOLOGY}:CKV_RECORD_BYTES"), Const(f"{TOPOLOGY}:CKV_PAGE_ALIGNMENT")
BLOCK = Const(f"{TOPOLOGY}:DEFAULT_BLOCK_TOKENS")
PAGE = "ceil(n * r / a) * a"


def page(n: Const | str) -> Calc:
    """Bytes of a page of n stored states (n a source, or a literal expression over `b` = block tokens)."""
    if isinstance(n, str):
        return Calc(PAGE.replace("n", f"({n})"), r=RECORD, a=ALIGN, b=BLOCK)
    return Calc(PAGE, n=n, r=RECORD, a=ALIGN)


def capabilities(doc: str, *figures: str) -> tuple[Figure, ...]:
    return tuple(Figure(doc, f, "*", CAPABILITY[f]) for f in figures)


def wo_a(tp: int, what: str) -> Calc:
    """BLOCKERS' wo_a table: bf16 (ops.o_proj.wo_a_bytes) against MXFP8 (1 B + 1/1024 B per weight)."""
    bf16 = Call("deepinfer_sm80.ops.o_proj:wo_a_bytes", (tp,), "bf16_total", scale=2**20)
    return Calc(
        {"mxfp8": "bf16 / 2 * (1 + 1 / 1024)", "over": "bf16 - bf16 / 2 * (1 + 1 / 1024)"}[what], bf16=bf16
    )


V41_VOCAB = Call("deepinfer_sm80.formats.v41:V41", path="vocab")
MARKOV_RANK = Call("deepinfer_sm80.formats.v41:V41", path="markov_rank")
DSPARK_BLOCK = Const("overlay/deepinfer_sm80/ops/dspark_draft/reference.py:SAMPLE_BLOCK")
TINY_AB = "bench-ab/tiny-v41-20261202T012214Z/ab.json"


def ab_method() -> tuple[Figure, ...]:
    doc, ab = "docs/AB_METHOD.md", TINY_AB
    return (
        Figure(doc, "0.005", "two-sided p ≈ 0.005 at 30 degrees", Calc("2 * t_sf(3, 30)")),
        Figure(doc, "0.01", "≈ 0.01 for the larger of its 2 documents", Calc("1 - (1 - 2 * t_sf(3, 30)) ** 2")),
        Figure(doc, "0.1", "~0.1 nats/token on its 31-position documents",
               Calc("s / sqrt(n)", s=Json(ab, "numeric_certificate.checks.1.worst.dnll_sd"),
                    n=Json(ab, "numeric_certificate.checks.1.worst.positions"))),
        Figure(doc, "0.5", "stays as a gross guard",
               Const("overlay/deepinfer_sm80/testing/e2e/runner.py:NLL_GROSS_GUARD")),
        Figure(doc, "0.5", "at B = 0.5 against B = 1",
               Defined("the example plan's burstiness, `burstiness: [0.5, 2]`, in the line above")),
        Figure(doc, "0.9", "drops below 0.9",
               Const("harness/deepinfer_harness/analysis/report.py:SATURATION")),
        Figure(doc, "1.0", "(1.0 in the tiny V4.1 profile",
               Text("harness/profiles/tiny-v41.yaml", r"greedy_match: (\d+\.\d+)")),
        Figure(doc, "12.7", "from 2 runs a t interval is ±12.7", Calc("t_ppf(0.975, 1)")),
    )  # fmt: skip


V41_SHAPE = {k: Call("deepinfer_sm80.formats.v41:V41", path=k) for k in ("hidden", "hc_mult")}
V41_ROW = {
    "n": Call("deepinfer_sm80.formats.v41:V41", path="nope_dim"),
    "r": Call("deepinfer_sm80.formats.v41:V41", path="rope_dim"),
}
# mHC's fn: (2 + hc) * hc projections of the hc * hidden residual, fp32
MHC_FN = "(2 + hc_mult) * hc_mult * hc_mult * hidden * 4"
MHC_PREFILL = Const("overlay/deepinfer_sm80/bench/mhc.py:TOKENS.9")  # the bench's prefill T
MHC_FLOOR = {
    f"t{i}": Json("gpu/mhc-bench-31b5269/mhc-h200.json", f"targets.{2 * i + 1}.measured") for i in range(8)
}


def v41(path: str, *args: int) -> Call:
    """A V4.1 shape (formats/v41.py, the one definition): `V41.<path>`, or `V41.per_rank(tp).<path>`."""
    if args:
        return Call("deepinfer_sm80.formats.v41:V41.per_rank", args, path)
    return Call("deepinfer_sm80.formats.v41:V41", path=path)


def model() -> tuple[Figure, ...]:
    doc = "docs/MODEL.md"
    whitepaper = r"whitepaper|datasheet"
    a100 = "| A100 40 / 80 GB SXM |"
    ga102 = ("| RTX 3090 |", "| RTX A6000 |")
    smem = "| shared memory per SM / per block (opt-in) |"
    device = "deepinfer_sm80.device"
    return (
        *capabilities(doc, "8.0", "8.6"),
        Figure(doc, "1,790", "Context KV per token per rank is about 1,790 bytes",
               Calc("3 * r / 2 + r + 3 * i / 2 + i", r=RECORD, i=Const(f"{TOPOLOGY}:IKV_RECORD_BYTES"))),
        Figure(doc, "128", "| sliding window |", v41("window")),
        Figure(doc, "129,280", "| vocabulary |", v41("vocab")),
        *(Figure(doc, fig, "| lm_head shard |", v41("lm_head_shard", tp))
          for fig, tp in (("64,640", 2), ("32,320", 4), ("16,160", 8))),
        Figure(doc, "2.0", "post alpha 2.0 (hard-coded upstream)",
               Quoted("upstream: vLLM 0.32.0's mHC post alpha, a literal in its kernels", r"hard-coded upstream")),
        Figure(doc, "1.56", a100, Quoted("vendor: NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020)", whitepaper)),
        Figure(doc, "2.04", a100, Quoted("vendor: NVIDIA A100 80GB datasheet", whitepaper)),
        Figure(doc, "80 GB", a100, Quoted("vendor: NVIDIA A100 80GB datasheet", whitepaper)),
        Figure(doc, "80GB", a100, Quoted("vendor: NVIDIA A100 80GB datasheet", whitepaper)),
        Figure(doc, "40 MB", a100, Quoted("vendor: NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020)", whitepaper)),
        Figure(doc, "40 MB", "| A800 |", Quoted("vendor: NVIDIA A800 datasheet", whitepaper)),
        Figure(doc, "64 GB", "| GA100 64 GB boards", Quoted("owner: the GA100 64 GB boards' report", r"owner's report")),
        Figure(doc, "0.94", ga102[0], Quoted("vendor: NVIDIA Ampere GA102 GPU Architecture whitepaper (2020)", whitepaper)),
        Figure(doc, "0.77", ga102[1], Quoted("vendor: NVIDIA RTX A6000 datasheet", whitepaper)),
        *(Figure(doc, "6 MB", row, Quoted("vendor: NVIDIA Ampere GA102 GPU Architecture whitepaper (2020)", whitepaper)) for row in ga102),
        Figure(doc, "164 KB", smem, Call(f"{device}:SM80", path="smem_per_sm", scale=1024)),
        Figure(doc, "166,912", smem, Call(f"{device}:SM80", path="smem_per_block")),
        Figure(doc, "100 KB", smem, Call(f"{device}:SM86", path="smem_per_sm", scale=1024)),
        Figure(doc, "101,376", smem, Call(f"{device}:SM86", path="smem_per_block")),
        Figure(doc, "99 KB", "fit every tile under SM86's 99 KB", Call(f"{device}:SM86", path="smem_per_block", scale=1024)),
    )  # fmt: skip


def oracle() -> tuple[Figure, ...]:
    """ORACLE.md: the calibration run (results/oracle/calibration-cpu.json; its two tables are rendered),
    the tolerances (testing/oracle/tolerance.py) and their ratios, the tiny checkpoint's recipe."""
    doc, cal = "docs/ORACLE.md", "oracle/calibration-cpu.json"
    tol = "overlay/deepinfer_sm80/testing/oracle/tolerance.py"
    tiny = "scripts/make_tiny_v41.py"

    def worst(ckpt: int, mode: str, key: str) -> Json:
        return Json(cal, f"per_checkpoint.{ckpt}.worst.{mode}.{key}")

    def mutation(ckpt: int, name: str) -> Json:
        return Json(cal, f"per_checkpoint.{ckpt}.mutations_nll_mean_abs.{name}")

    token, mean, selecting = "| `NLL_TOKEN_TOL` |", "| `NLL_MEAN_TOL` |", "| `NLL_MEAN_TOL_SELECTING` |"
    margin, margin_sel = "| `GREEDY_MARGIN` |", "| `GREEDY_MARGIN_SELECTING` |"
    return (
        Figure(doc, "4.0", token, Const(f"{tol}:NLL_TOKEN_TOL")),
        Figure(doc, "2.2", token, Calc("t / w", t=Const(f"{tol}:NLL_TOKEN_TOL"), w=worst(1, "order", "nll_token_max"))),
        Figure(doc, "0.125", mean, Const(f"{tol}:NLL_MEAN_TOL")),
        Figure(doc, "2.7", mean, Calc("t / w", t=Const(f"{tol}:NLL_MEAN_TOL"), w=worst(0, "order", "nll_mean_abs"))),
        Figure(doc, "1.9", mean, Calc("min(a, b, c, d) / t", t=Const(f"{tol}:NLL_MEAN_TOL"),
                                      **{k: mutation(0, n) for k, n in zip("abcd", ("no_sink", "no_fp8_kv", "no_engram", "no_inverse_rope"), strict=True)})),
        Figure(doc, "0.25", selecting, Const(f"{tol}:NLL_MEAN_TOL_SELECTING")),
        Figure(doc, "2.5", selecting, Calc("t / w", t=Const(f"{tol}:NLL_MEAN_TOL_SELECTING"), w=worst(1, "order", "nll_mean_abs"))),
        *(Figure(doc, fig, selecting, Calc("m / t", t=Const(f"{tol}:NLL_MEAN_TOL_SELECTING"), m=mutation(1, name)))
          for fig, name in (("2.9", "all_compressed"), ("1.4", "no_sink"), ("0.4", "no_fp8_kv"), ("0.24", "no_candidates"))),
        Figure(doc, "2.0", margin, Const(f"{tol}:GREEDY_MARGIN")),
        Figure(doc, "3.5", margin_sel, Const(f"{tol}:GREEDY_MARGIN_SELECTING")),
        Figure(doc, "512", "With the default config (top-k 512)", Json(cal, "per_checkpoint.0.index_topk")),
        Figure(doc, "1,024", "in a 1,024 vocabulary", Text(tiny, r'"vocab_size": (\d+)')),
        Figure(doc, "20,480", "K up to 20,480 in the mHC projection", Calc("hc_mult * hidden", **V41_SHAPE)),
        Figure(doc, "0.02", "A random-weight head with N(0, 0.02^2) rows", Text(tiny, r'"initializer_range": ([\d.]+)')),
        Figure(doc, "0.05", "*", Const(f"{tiny}:HEAD_STD")),
    )  # fmt: skip


def gpus(profile: str) -> Calc:
    """tp x pp of a harness profile's topology line."""
    path = f"harness/profiles/{profile}.yaml"
    return Calc(
        "tp * pp", tp=Text(path, r"^topology: \{tp: (\d+)"), pp=Text(path, r"^topology: \{tp: \d+, pp: (\d+)")
    )


def harness_readme() -> tuple[Figure, ...]:
    doc, ab, hb = "harness/README.md", TINY_AB, "harness/deepinfer_harness"
    tiny = "All 8 runs valid, arm parity ok"
    cert = "`test_nll_certificate.py` (the NLL z rule"
    stats = f"{hb}/analysis/stats.py"
    manifest = "bench-ab/tiny-v41-20261202T012214Z/manifest.json"
    return (
        Figure(doc, "0.02", tiny, Json(ab, "numeric_certificate.tolerances_of_the_run.nll_doc_abs")),
        Figure(doc, "2.5", tiny, Json(ab, "numerics.1.ab.0.dnll_abs_max")),
        Figure(doc, "1.0", tiny, Json(ab, "numerics.1.ab.0.top1_agreement")),
        Figure(doc, "0.15", "rounding noise of mean size 0.15 nats", Json(ab, "numerics.1.ab.0.dnll_abs_mean")),
        Figure(doc, "0.1", "mean moves by ~0.1 by noise alone",
               Calc("s / sqrt(n)", s=Json(ab, "numeric_certificate.checks.1.worst.dnll_sd"),
                    n=Json(ab, "numeric_certificate.checks.1.worst.positions"))),
        Figure(doc, "0.05", cert, Text("harness/tests/test_nll_certificate.py", r"shift = ([\d.]+) \+ alternating")),
        Figure(doc, "0.02", cert, Text("harness/tests/test_nll_certificate.py", r'old = certificate\(.*"nll_doc_abs": ([\d.]+)\}')),
        Figure(doc, "5 MB", cert, Text("harness/tests/test_client_fake.py", r"~(\d+) MB single-line first event")),
        Figure(doc, "0.5", "`rate-i3k-o512-r0p5-poisson` (open loop, 0.5 requests/s",
               Defined("the rate the cell id beside it spells (r0p5)")),
        Figure(doc, "0.9", "rate attainment is below 0.9", Const(f"{hb}/analysis/report.py:SATURATION")),
        Figure(doc, "0.975", "floor = |mean| + t(0.975, n−1)", Calc("(1 + 0.95) / 2")),  # a two-sided 95 % interval
        Figure(doc, "12.7", "from 2 runs a t interval is ±12.7", Calc("t_ppf(0.975, 1)")),
        Figure(doc, "1.60×", "Two A runs 1.60× apart give a floor of 60 %", Defined("a worked example of the floor rule")),
        Figure(doc, "1.60", "not the width of an interval around 1.60", Defined("the same worked example")),
        *(Figure(doc, "2.8", "**MDE** = exp(max(floor, 2.8",
                 Calc("a + b", a=Text(stats, r"^Z_ALPHA, Z_POWER = ([\d.]+),"), b=Text(stats, r"^Z_ALPHA, Z_POWER = [\d.]+, ([\d.]+)"))),),
        Figure(doc, "3×", "*", Text(f"{hb}/config.py", r"first_request_factor: Float = ([\d.]+)")),
        Figure(doc, "5 ms", "a thread writes a byte into a socket pair every 5 ms", Const(f"{hb}/run/looplag.py:PERIOD_NS", scale=1e6)),
        Figure(doc, "256 KB", "in pieces of ≤ 256 KB", Text(f"{hb}/workloads.py", r"max_chars: int = (\d+) \* 1024")),
        Figure(doc, "25 min", "| `tiny-v41` |", Calc("(e - s) / 60", e=Json(manifest, "ended_at"), s=Json(manifest, "started_at"))),
        Figure(doc, "16×", "| `a800x16-tp8pp2` |", gpus("a800x16-tp8pp2")),
        Figure(doc, "6×", "| `ga100x6-tp2pp3` |", gpus("ga100x6-tp2pp3")),
        Figure(doc, "8×", "| `ga100x8-tp4pp2` |", gpus("ga100x8-tp4pp2")),
        Figure(doc, "8×", "| `a100x8-tp8` |", Text("harness/profiles/a100x8-tp8.yaml", r"^topology: \{tp: (\d+)")),
        Figure(doc, "64 GB", "| `ga100x6-tp2pp3` |", Text("harness/profiles/ga100x6-tp2pp3.yaml", r"^# 6x GA100 (\d+)GB")),
        Figure(doc, "1.25×", "every token 1.25× sooner on 8", Text("harness/tests/test_compare.py", r'\("ga100x8-tp4pp2-synth", \(4, 2\), ([\d.]+)\)')),
    )  # fmt: skip


def bare_numbers() -> tuple[Figure, ...]:
    """Shapes, sizes and limits typed as plain numbers (5120, 1536, 2048) outside the tables above."""
    mhc, idx, model, val = "docs/MHC.md", "docs/INDEXER.md", "docs/MODEL.md", "docs/VALIDATE.md"
    splits, bench_mhc = "overlay/deepinfer_sm80/ops/mhc/splits.py", "overlay/deepinfer_sm80/bench/mhc.py"
    stream, tiny = "overlay/deepinfer_sm80/ops/indexer/stream.py", "scripts/make_tiny_v41.py"
    ikv = Const(f"{TOPOLOGY}:IKV_RECORD_BYTES")
    o_input = "| local o-groups / o_proj input |"
    dims = "Real where the kernels see it: hidden 5120"
    return (
        # MHC.md: hidden size, the epilogue's columns, the bench's prefill size
        Figure(mhc, "5120", "*", v41("hidden")),
        Figure(mhc, "1024", "| first layer, attention |",
               Quoted("upstream: vLLM 0.32.0's hc_prenorm_gemm TileLang config below 128 tokens", r"upstream function")),
        Figure(mhc, "1024", "grid (T, H / 1024", Const(f"{splits}:EPILOGUE_COLUMNS")),
        Figure(mhc, "1024", "a (T, H / 1024) grid", Const(f"{splits}:EPILOGUE_COLUMNS")),
        Figure(mhc, "4096", "4096 and 7168 align the same way", Text(splits, r"EPILOGUE_COLUMNS = 1024 .*\((\d+), 5120, 7168 all divide")),
        Figure(mhc, "7168", "4096 and 7168 align the same way", Text(splits, r"EPILOGUE_COLUMNS = 1024 .*\(4096, 5120, (\d+) all divide")),
        Figure(mhc, "1536", "*", Const(f"{bench_mhc}:TOKENS.9")),
        # INDEXER.md: pages, the stream's bounds, V4.1's candidate blocks, the bench's queries
        Figure(idx, "17280", "Pages are rounded up to 576 bytes", Calc(PAGE.replace("n", "b"), r=ikv, a=ALIGN, b=BLOCK)),
        Figure(idx, "8640", "Pages are rounded up to 576 bytes", Calc(PAGE.replace("n", "(b / 2)"), r=ikv, a=ALIGN, b=BLOCK)),
        Figure(idx, "2048", "Layer 20 also keeps its best 2048", v41("candidate_blocks")),
        Figure(idx, "2048", "[+ the same at 2048 blocks]", v41("candidate_blocks")),
        Figure(idx, "2048", "| decode |", v41("candidate_blocks")),
        Figure(idx, "2048", "(V4.1: 2048)", v41("candidate_blocks")),
        Figure(idx, "2048", "is measured with 2048 queries only",
               Text("overlay/deepinfer_sm80/bench/indexer.py", r"dense_m = m if n <= \(1 << 18\) else (\d+)")),
        Figure(idx, "8192", "a [8192, 1M] fp32 matrix", Const("overlay/deepinfer_sm80/bench/indexer.py:PREFILL_QUERIES")),
        *(Figure(idx, "8192", where, Calc("n * d", n=Const(f"{stream}:BLOCK_N"), d=v41("indexer_dim")))  # a tile's codes
          for where in ("the software decode of 8192 codes", "the decode (8192 codes")),
        Figure(idx, "65536", "C = min(⌈L/512⌉·512, 65536)", Const(f"{stream}:CHUNK_MAX")),
        Figure(idx, "16384", "| prefill, candidate-only |", Calc("n * b", n=v41("candidate_blocks"), b=v41("candidate_block_size"))),
        Figure("docs/CHARTS.md", "8192", "streamed against dense at 8192 queries",
               Const("overlay/deepinfer_sm80/bench/indexer.py:PREFILL_QUERIES")),
        # MODEL.md: the config's shapes, per-rank o_proj input, threads per SM, the whitepapers' year
        Figure(model, "5120", "| hidden size, target layers |", v41("hidden")),
        Figure(model, "1280", "| low-rank projections |", v41("q_lora")),
        Figure(model, "1024", "| low-rank projections |", v41("o_lora")),
        Figure(model, "2048", "| candidate blocks |", v41("candidate_blocks")),
        Figure(model, "2304", "| MoE |", v41("moe_intermediate")),
        *(Figure(model, fig, o_input, Calc("g * o", g=v41("o_groups", tp), o=v41("o_lora")))
          for fig, tp in (("4096", 2), ("2048", 4), ("1024", 8))),
        Figure(model, "2048", "| threads / CTAs per SM |", Call("deepinfer_sm80.device:SM80", path="max_threads_per_sm")),
        Figure(model, "1536", "| threads / CTAs per SM |", Call("deepinfer_sm80.device:SM86", path="max_threads_per_sm")),
        Figure(model, "2020", "*", Quoted("vendor: the NVIDIA whitepapers' year of publication", r"whitepaper \(2020\)")),
        # VALIDATE.md: the tiny checkpoint keeps these dims real (V4.1's), and its own vocabulary
        Figure(val, "5120", dims, v41("hidden")),
        Figure(val, "1280", dims, v41("q_lora")),
        Figure(val, "1024", dims, v41("o_lora")),
        Figure(val, "2048", dims, v41("candidate_blocks")),
        Figure(val, "1024", "vocabulary 1024", Text(tiny, r'"vocab_size": (\d+)')),
        Figure(val, "1000", "DSpark noise token 1000", Text(tiny, r'"dspark_noise_token_id": (\d+)')),
        Figure("docker/README.md", "1000", "| `IMAGE_UID` |", Quoted("vendor: the Ubuntu base image's ubuntu user", r"Ubuntu's `ubuntu`")),
        Figure("harness/README.md", "1024", "(`k` = ×1024", Calc("n / 649", n=Text("harness/tests/test_cells.py", r'parse_size\("649k"\) == (\d+)'))),
    )  # fmt: skip


def pp_plan(*partition: int):
    from deepinfer_sm80.integration.pp import plan as P
    from deepinfer_sm80.integration.pp.topology import Topology, v41_flash_fields

    return P.build_plan(Topology.from_config(v41_flash_fields()), partition)


def e2e_cpu() -> tuple[Figure, ...]:
    """E2E_CPU.md's prose on the NLL shift: results/e2e-nll-shift.json (its tables are rendered),
    the runner's constants, the full-plan base run."""
    doc, shift = "docs/E2E_CPU.md", "e2e-nll-shift.json"
    runner = "overlay/deepinfer_sm80/testing/e2e/runner.py"
    e2e = ("short_12", "long_48", "long_130")
    extras = [f"extra_{i}" for i in range(16)]

    def pp(prompt: str, path: str) -> Json:
        return Json(shift, f"per_prompt.{prompt}.{path}")

    def over(fn: str, prompts, path: str) -> Calc:
        names = {f"p{i}": pp(p, path) for i, p in enumerate(prompts)}
        return Calc(f"{fn}({', '.join(names)})", **names)

    ind = "independent.engine"
    sixteen = "Over the 16 independent prompts the engine's mean shift"
    settle = "The full logit rows settle it"
    spread = "the SD over prompts of a prompt's own z"
    small = "It is small, though"
    gate = "The prediction c is not subtracted in the E2E gate"
    modes = "The oracle's own modes have first-order terms of the same kind"
    explained = "A scale that explained their first-order terms"
    scale1 = "A 1 % scale would add about 0.29 nats"
    peaks = "The peaks sit 28 logits above the mean"
    return (
        Figure(doc, "0.001", settle, Json(shift, f"{ind}.residual.mean")),
        Figure(doc, "0.095", settle, Json(shift, f"{ind}.residual.se")),
        Figure(doc, "0.028", sixteen, Json(shift, f"{ind}.observed.mean")),
        Figure(doc, "0.096", sixteen, Json(shift, f"{ind}.observed.se")),
        Figure(doc, "0.027", sixteen, Json(shift, f"{ind}.curvature.mean")),
        Figure(doc, "0.001", sixteen, Json(shift, f"{ind}.residual.mean")),
        Figure(doc, "0.095", sixteen, Json(shift, f"{ind}.residual.se")),
        Figure(doc, "0.0016", "Over the 16 prompts, a − 1 =", Json(shift, f"{ind}.scale.mean")),
        Figure(doc, "0.0007", "Over the 16 prompts, a − 1 =", Json(shift, f"{ind}.scale.se")),
        Figure(doc, "1.13", "they range from", over("min", extras, "engine.observed.mean")),
        Figure(doc, "0.56", "they range from", over("max", extras, "engine.observed.mean")),
        Figure(doc, "0.004", small, over("min", e2e, "engine.curvature.mean")),
        Figure(doc, "0.031", small, over("max", e2e, "engine.curvature.mean")),
        Figure(doc, "0.004", gate, over("min", e2e, "engine.curvature.mean")),
        Figure(doc, "0.03", gate, over("max", e2e, "engine.curvature.mean")),
        Figure(doc, "0.3", gate, Calc("max(a / x, b / y, c / z)", a=pp("short_12", "engine.curvature.mean"), x=pp("short_12", "engine.observed.se"),
                                     b=pp("long_48", "engine.curvature.mean"), y=pp("long_48", "engine.observed.se"),
                                     c=pp("long_130", "engine.curvature.mean"), z=pp("long_130", "engine.observed.se"))),
        Figure(doc, "0.066", "*", pp("short_12", "oracle_length.observed.mean")),
        Figure(doc, "0.205", "and reports +0.205", Json("e2e-cpu-full-base.json", "engines.0.levels.base.cases.0.oracle.0.nll_shift")),
        Figure(doc, "0.139", "The same engine against the oracle run on the prompt alone", pp("short_12", "engine.observed.mean")),
        Figure(doc, "0.4", "per position, f has an SD of", over("min", e2e, "engine.first_order.sd")),
        Figure(doc, "1.2", "per position, f has an SD of", over("max", e2e, "engine.first_order.sd")),
        Figure(doc, "0.14", "while d spreads by only 0.14", over("mean", e2e, "engine.sd_vocab_mean")),
        Figure(doc, "0.125", peaks, Calc("2.0 ** -3")),  # one bf16 ulp (8 mantissa bits) in [16, 32)
        Figure(doc, "0.25", peaks, Calc("2.0 ** -2")),  # ... and in [32, 64)
        Figure(doc, "0.28", modes, pp("long_130", "oracle_fp32.first_order.mean")),
        Figure(doc, "0.25", modes, over("max", extras, "oracle_order.first_order.mean")),
        Figure(doc, "0.29", modes, over("min", extras, "oracle_order.first_order.mean")),
        Figure(doc, "0.9993", modes, over("min", e2e, "engine.scale.mean_scale")),
        Figure(doc, "1.0003", modes, over("max", e2e, "engine.scale.mean_scale")),
        Figure(doc, "2.4", explained, Calc("min(" + ", ".join(f"(f{i} - s{i}) / e{i}" for i in range(3)) + ")",
               **{f"f{i}": pp(p, "engine.scale_for_first_order") for i, p in enumerate(e2e)},
               **{f"s{i}": pp(p, "engine.scale.mean_scale") for i, p in enumerate(e2e)},
               **{f"e{i}": pp(p, "engine.scale.se") for i, p in enumerate(e2e)})),
        Figure(doc, "1.003", "A scale that explained their first-order terms", over("min", e2e, "engine.scale_for_first_order")),
        Figure(doc, "1.007", "A scale that explained their first-order terms", over("max", e2e, "engine.scale_for_first_order")),
        Figure(doc, "0.29", scale1, Calc("0.01 * h", h=over("mean", e2e + tuple(extras), "engine.peak_height_mean"))),
        Figure(doc, "0.01", scale1, Defined("a 1 % scale, the sentence's own example")),
        Figure(doc, "28.6", scale1, over("mean", e2e + tuple(extras), "engine.peak_height_mean")),
        Figure(doc, "2.2×", scale1, Json(shift, f"{ind}.residual_z_sd")),
        Figure(doc, "2.20", spread, Json(shift, f"{ind}.residual_z_sd")),
        Figure(doc, "2.15", spread, Json(shift, "independent.oracle_order.residual_z_sd")),
        Figure(doc, "1.06", spread, Json(shift, "independent.oracle_length.residual_z_sd")),
        Figure(doc, "2.2", "*", Const(f"{runner}:NLL_Z_SPREAD")),
        Figure(doc, "0.125", "The argued tolerance `NLL_MEAN_TOL`", Const("overlay/deepinfer_sm80/testing/oracle/tolerance.py:NLL_MEAN_TOL")),
        Figure(doc, "0.5", "`NLL_GROSS_GUARD` = 64 eps", Const(f"{runner}:NLL_GROSS_GUARD")),
        Figure(doc, "4.0", "the per-token bound `NLL_TOKEN_TOL`", Const("overlay/deepinfer_sm80/testing/oracle/tolerance.py:NLL_TOKEN_TOL")),
        Figure(doc, "1,024", "the vocabulary has 1,024 entries", Text("scripts/make_tiny_v41.py", r'"vocab_size": (\d+)')),
        Figure(doc, "1000", "the labels' support", Json(shift, "label_support.1")),
        Figure(doc, "128", "needs a first request of more than 128 tokens", BLOCK),
        Figure(doc, "130", "It runs on the three E2E prompts", Json(shift, "prompts.long_130")),
        Figure(doc, "2.13", "*", pin("TORCH_VERSION")),
    )  # fmt: skip


def pipeline() -> tuple[Figure, ...]:
    doc, cap = "docs/PIPELINE.md", "pp-kv-capacity.json"
    cost = "Cost per rank on the last stage"
    checks = "`tests/test_pp_capacity.py` checks every page"
    ikv = Const(f"{TOPOLOGY}:IKV_RECORD_BYTES")

    def ikv_page(n: str) -> Calc:
        return Calc(PAGE.replace("n", f"({n})"), r=ikv, a=ALIGN, b=BLOCK)

    def plan(what: str, fn) -> Code:
        return Code(f"integration/pp/plan.py: {what} (V4.1-Flash's topology)", fn)

    return (
        Figure(doc, "0.92", "*", Json(cap, "deployments.0.assumptions.gpu_memory_utilization")),
        Figure(doc, "0.95", "*", Json(cap, "deployments.1.assumptions.gpu_memory_utilization")),
        Figure(doc, "64 GiB", "Cards: 64 GiB each", Json(cap, "deployments.0.assumptions.card_gib")),
        Figure(doc, "4.25", "MXFP4 experts at 4.25 bits/param", Json(cap, "deployments.0.assumptions.expert_bits_per_param")),
        Figure(doc, "6 GiB", "a 2 / 4 / 6 GiB assumed reserve", Json(cap, "deployments.0.assumptions.reserve_gib_swept.2")),
        Figure(doc, "1,048,576", "A 1,048,576-token request takes", Json(cap, "deployments.0.assumptions.max_model_len")),
        Figure(doc, "8,192", "8,192 blocks of the compressed group", Json(cap, "deployments.0.groups.4.blocks_per_request")),
        *(Figure(doc, fig, cost, Calc(f"v / {tp} * h * 2", v=v41("vocab"), h=v41("hidden")))
          for fig, tp in (("1,323,827,200", 1), ("661,913,600", 2), ("330,956,800", 4), ("165,478,400", 8))),
        Figure(doc, "10,240", "one `hidden_size` bf16 row per aux layer", Calc("h * 2", h=v41("hidden"))),
        Figure(doc, "40,976", "boundary payload beyond upstream's", Calc("hc * h * 2 + hc * 4", hc=v41("hc_mult"), h=v41("hidden"))),
        Figure(doc, "8,908", "| 14,14,12 |", plan("payload_bytes_per_token(1) of 14,14,12", lambda: pp_plan(14, 14, 12).payload_bytes_per_token(1))),
        Figure(doc, "2,632", "| 13,14,13 (vLLM's default) |",  # the token ids are named beside the table
               Calc("p - i", p=plan("payload_bytes_per_token(0) of 13,14,13", lambda: pp_plan(13, 14, 13).payload_bytes_per_token(0)),
                    i=Const(f"{TOPOLOGY}:TOKEN_ID_BYTES"))),
        Figure(doc, "631 MiB", cost, Calc("v / 2 * h * 2 / 2**20", v=v41("vocab"), h=v41("hidden"))),
        Figure(doc, "10,956", "| 13,14,13 (vLLM's default) |", plan("payload_bytes_per_token(1) of 13,14,13", lambda: pp_plan(13, 14, 13).payload_bytes_per_token(1))),
        Figure(doc, "292.5", "| 13,14,13 (vLLM's default) |", plan("replica_kv_bytes_per_token(1) of 13,14,13", lambda: pp_plan(13, 14, 13).replica_kv_bytes_per_token(1))),
        Figure(doc, "74,880", "*", page(BLOCK)),
        Figure(doc, "74880", "*", page(BLOCK)),
        Figure(doc, "37440", "*", page("b / 2")),
        Figure(doc, "17280", "*", ikv_page("b")),
        Figure(doc, "129280", cost, v41("vocab")),
        Figure(doc, "5120", "*", v41("hidden")),
        Figure(doc, "2048", "*", Calc("k * 4", k=v41("topk"))),  # a top-k row: index_topk int32
        Figure(doc, "8192", "*", Calc("n * 4", n=v41("candidate_blocks"))),  # a candidate row: its blocks, int32
        Figure(doc, "37,440", checks, page("b / 2")),
        Figure(doc, "19,008", checks, page("32")),
        Figure(doc, "17,280", "*", ikv_page("b")),
        Figure(doc, "8,640", checks, ikv_page("b / 2")),
    )  # fmt: skip


def readme() -> tuple[Figure, ...]:
    doc = "README.md"
    return (
        *capabilities(doc, "8.0", "8.9"),
        Figure(doc, "2.13", "executed at torch 2.13 on sm_80", pin("TORCH_VERSION")),
        Figure(doc, "64 GB", "the 64 GB GA100", Json("hardware-fit.json", "deployments.0.cards.1.card_gib")),
        Figure(doc, "80 GB", "what is left on 40, 64 and 80 GB cards", Json("hardware-fit.json", "deployments.0.cards.2.card_gib")),
    )  # fmt: skip


BLOCKERS = "docs/BLOCKERS.md"
FIGURES: tuple[Figure, ...] = (
    *capabilities(BLOCKERS, "8.0", "8.6", "8.9", "9.0"),
    Figure(BLOCKERS, "128", "compressed pages of 128 tokens", BLOCK),
    Figure(BLOCKERS, "74,880", "compressed pages of 128 tokens", page(BLOCK)),
    Figure(BLOCKERS, "37,440", "37,440 B (ratio 2)", page("b / 2")),
    Figure(BLOCKERS, "19,008", "SWA pages of 32 tokens", page("32")),
    Figure(BLOCKERS, "99 KB", "(99 KB shared memory per block)",
           Call("deepinfer_sm80.device:SM86", path="smem_per_block", scale=1024)),
    Figure(BLOCKERS, "147,455", "long-row paths (> 147,455 B",
           Const("overlay/deepinfer_sm80/integration/attention_select.py:TOPK_LONG_ROW_SMEM")),
    Figure(BLOCKERS, "98,303", "rows past 98,303 tokens",
           Const("overlay/deepinfer_sm80/integration/attention_select.py:TOPK_LONG_ROW_TOKENS")),
    *(Figure(BLOCKERS, fig, f"| {tp} | ", wo_a(tp, what))
      for tp, figs in ((2, ("688.67", "687.33")), (4, ("344.34", "343.66")), (8, ("172.17", "171.83")))
      for fig, what in zip(figs, ("mxfp8", "over"), strict=True)),
    *(Figure(BLOCKERS, fig, f"| {tp} | ", Call("deepinfer_sm80.ops.o_proj:wo_a_bytes", (tp,), key, scale=2**20))
      for tp, figs in ((2, ("32 MiB", "1376 MiB")), (4, ("16 MiB", "688 MiB")), (8, ("8 MiB", "344 MiB")))
      for fig, key in zip(figs, ("bf16_per_layer", "bf16_total"), strict=True)),
    Figure(BLOCKERS, "2.11", "patches-h200.json (H200: torch 2.11", H200_TORCH),
    Figure(BLOCKERS, "3.6", "patches-h200.json (H200: torch 2.11, triton 3.6", H200_TRITON),
    Figure(BLOCKERS, "2.13", "*", pin("TORCH_VERSION")),

    # docs/ARCHITECTURE.md
    *capabilities("docs/ARCHITECTURE.md", "8.0", "8.6", "8.9", "9.0"),
    Figure("docs/ARCHITECTURE.md", "13.0", "All in `docker/versions.env`", pin("CUDA_MAJOR_MINOR")),
    Figure("docs/ARCHITECTURE.md", "3.12", "All in `docker/versions.env`", pin("IMAGE_PYTHON_VERSION")),
    # docs/FP8_DS_MLA.md
    Figure("docs/FP8_DS_MLA.md", "19,008", "32-token sliding-window page", page("32")),
    Figure("docs/FP8_DS_MLA.md", "74,880", "74,880 for 128 compressed states", page(BLOCK)),
    Figure("docs/FP8_DS_MLA.md", "37,440", "37,440 for 64", page("b / 2")),
    *capabilities("docs/FP8_DS_MLA.md", "8.9"),
    # docs/GPU_ENGINE.md
    Figure("docs/GPU_ENGINE.md", "0.25", "its margin of 0.25", Const("scripts/tiny_v41_drafter.py:MARGIN")),
    Figure("docs/GPU_ENGINE.md", "2.11", "| 8 at d0077a0 |", Json("gpu/engine-d0077a0-h100.json", "provenance.versions.torch")),
    Figure("docs/GPU_ENGINE.md", "80GB", "| 8 at d0077a0 |", Text("results/gpu/engine-d0077a0-h100.json", r"H100 (80)GB")),
    Figure("docs/GPU_ENGINE.md", "80GB", "| 13 at b567a48 |", Text("results/gpu/engine-b567a48-h100.json", r"H100 (80)GB")),
    Figure("docs/GPU_ENGINE.md", "8.0", "five capability queries answer False", CAPABILITY["8.0"]),
    # docs/INDEXER.md
    *capabilities("docs/INDEXER.md", "8.0", "8.9", "9.0"),
    Figure("docs/INDEXER.md", "3.7", "(triton 3.7's", pin("TRITON_VERSION")),
    Figure("docs/INDEXER.md", "128 MiB", "*", Const("overlay/deepinfer_sm80/ops/indexer/stream.py:WORKSPACE_BYTES", scale=2**20)),
    Figure("docs/INDEXER.md", "32 GiB", "a [8192, 1M] fp32 matrix alone is 32 GiB",
           Calc("q * k * 4 / 2**30", q=Const("overlay/deepinfer_sm80/bench/indexer.py:PREFILL_QUERIES"),
                k=Const("overlay/deepinfer_sm80/bench/indexer.py:KEYS.2"))),
    # docs/PATCH_01.md
    *capabilities("docs/PATCH_01.md", "8.0"),
    Figure("docs/PATCH_01.md", "25.2", "= 25.2 MB", Calc("(8192 * 641 * 4 + 8192 * 129 * 4) / 1e6")),
    Figure("docs/PATCH_01.md", "24.1", "(24.1 MiB)", Calc("(8192 * 641 * 4 + 8192 * 129 * 4) / 2**20")),
    Figure("docs/PATCH_01.md", "8192", "at 8192 batched tokens",
           Text("harness/profiles/ga100x6-tp2pp3.yaml", r'--max-num-batched-tokens, "(\d+)"')),
    Figure("docs/PATCH_01.md", "4 GB", "(4 GB at 1M tokens)",
           Quoted("upstream: vLLM 0.32.0's V4 attention PREFILL_CHUNK_SIZE x 1M tokens / ratio x 1 KB",
                  r"PREFILL_CHUNK_SIZE")),
    # docs/SERVING.md
    Figure("docs/SERVING.md", "40 GB", "Where a 40 GB card does not fit", Json("hardware-fit.json", "deployments.0.cards.0.card_gib")),
    # docs/SPARSE_MLA.md
    *capabilities("docs/SPARSE_MLA.md", "8.9", "9.0"),
    Figure("docs/SPARSE_MLA.md", "0.04", "upstream's `_decode_num_splits` model",
           Quoted("upstream: vLLM 0.32.0's _decode_num_splits cost model (ops/sparse_mla/decode.py copies it)", r"upstream's")),
    Figure("docs/SPARSE_MLA.md", "1,536", "Prefill of a 1,536-token", Json("gpu/sparse_mla-h200.json", "rows.108.size")),
    Figure("docs/SPARSE_MLA.md", "32 KB", "fp32 partial",  # a head block's fp32 rows of head_dim
           Calc("h * d * 4 / 1024", h=Const("overlay/deepinfer_sm80/ops/sparse_mla/decode.py:BASE_BLOCK_H"), d=v41("head_dim"))),
    # docs/VALIDATE.md
    *capabilities("docs/VALIDATE.md", "8.0"),
    Figure("docs/VALIDATE.md", "2.11", "one H200 (torch 2.11", H200_TORCH),
    Figure("docs/VALIDATE.md", "3.6", "triton 3.6: not our pins", H200_TRITON),
    # docs/VERIFYING.md
    Figure("docs/VERIFYING.md", "2.11", "The H200 has torch 2.11", H200_TORCH),
    Figure("docs/VERIFYING.md", "3.6", "The H200 has torch 2.11 and triton 3.6", H200_TRITON),
    Figure("docs/VERIFYING.md", "2.13", "the compiled vLLM ops at torch 2.13", pin("TORCH_VERSION")),
    # docker/README.md
    Figure("docker/README.md", "13.0", "next to the 13.0 headers", pin("CUDA_MAJOR_MINOR")),
    Figure("docker/README.md", "13.5", "pulled nvcc 13.5",
           Quoted("upstream: the nvcc pip resolved for humming-kernels[cu13] when the pin was added", r"humming-kernels")),
    Figure("docker/README.md", "24.04", "exist in Ubuntu 24.04", Text("docker/Dockerfile.sm80", r"^ARG BASE_IMAGE=\S*ubuntu(\d+\.\d+)")),
    Figure("docker/README.md", "3.11", "its CPython 3.11 wheel", Calc("3 + m / 100", m=Text(PINS, r"^RAY_CPU_WHEEL=ray-[\d.]+-cp3(\d+)-"))),
    Figure("docker/README.md", "3.12", "| `PYTHON_VERSION` |", pin("IMAGE_PYTHON_VERSION")),
    Figure("docker/README.md", "3.13", "| `PYTHON_VERSION` |", Quoted("vendor: Debian trixie's python3 package", r"Debian trixie")),
    Figure("docker/README.md", "30 min", "waits up to 30 min",
           Quoted("upstream: vLLM 0.32.0 ray_utils.py _wait_until_pg_ready's placement-group timeout", r"ray_utils\.py")),
    # docs/AB_METHOD.md
    *ab_method(),
    # docs/DSPARK.md
    *capabilities("docs/DSPARK.md", "9.0"),
    Figure("docs/DSPARK.md", "0.006", "when its own test ran next (0.006 s)",
           Text("results/gpu/dspark_draft-h200-tests-12ba3da.xml", r'test_one_launch_chain_matches_reference\[random-False\]" time="([\d.]+)"')),
    Figure("docs/DSPARK.md", "0.25", "below u = 0.25", Text("overlay/deepinfer_sm80/ops/dspark_draft/kernel.py", r"tl\.where\(u < ([\d.]+),")),
    Figure("docs/DSPARK.md", "1,024", "*", Const("overlay/deepinfer_sm80/ops/dspark_draft/reference.py:SAMPLE_BLOCK")),
    Figure("docs/DSPARK.md", "129,280", "*", V41_VOCAB),
    Figure("docs/DSPARK.md", "2,504", "V = 2,504 in the interpreter", Text("overlay/tests/ops/test_dspark_draft.py", r"V = V41\.vocab if GPU else (\d+)")),
    *(Figure("docs/DSPARK.md", fig, "per-rank shards", Calc(f"v / {tp}", v=V41_VOCAB))
      for fig, tp in (("64,640", 2), ("32,320", 4), ("16,160", 8))),
    Figure("docs/DSPARK.md", "512 KB", "its 512 KB slice", Calc("b * r * 2 / 1024", b=DSPARK_BLOCK, r=MARKOV_RANK)),
    Figure("docs/DSPARK.md", "66 MB", "read the 66 MB head once", Calc("v * r * 2 / 1e6", v=V41_VOCAB, r=MARKOV_RANK)),
    # docs/MHC.md
    *capabilities("docs/MHC.md", "9.0"),
    Figure("docs/MHC.md", "1.30x", "the write-up's 1.30x / 2.89x", Quoted("seed: the reference write-up's mHC speed-ups at T = 6 / 12", r"write-up's")),
    Figure("docs/MHC.md", "2.89x", "the write-up's 1.30x / 2.89x", Quoted("seed: the reference write-up's mHC speed-ups at T = 6 / 12", r"write-up's")),
    Figure("docs/MHC.md", "1024", "| every later boundary |", Quoted("upstream: vLLM 0.32.0's hc_prenorm_gemm TileLang config, which switches at 1024 tokens", r"upstream function")),
    Figure("docs/MHC.md", "128", "*", Const("overlay/deepinfer_sm80/ops/mhc/splits.py:TC_MIN_TOKENS")),
    Figure("docs/MHC.md", "64 MiB", "since one call carries at most 64 MiB",
           Quoted("vendor: the device service's limit on what one call carries (its README)", r"one call carries at most")),
    Figure("docs/MHC.md", "13.0", "TileLang 0.1.12 -> CUDA C -> nvcc 13.0", pin("CUDA_MAJOR_MINOR")),
    Figure("docs/MHC.md", "2.11", "## H200 run (2026-12-01", Json("gpu/mhc-run1/mhc-h200-run1.json", "provenance.versions.torch")),
    Figure("docs/MHC.md", "3.6", "## H200 run (2026-12-01", Json("gpu/mhc-run1/mhc-h200-run1.json", "provenance.versions.triton")),
    Figure("docs/MHC.md", "2.11", "One device call after the GPU check above", Json("gpu/mhc-bench-31b5269/mhc-h200.json", "provenance.versions.torch")),
    Figure("docs/MHC.md", "3.6", "One device call after the GPU check above", Json("gpu/mhc-bench-31b5269/mhc-h200.json", "provenance.versions.triton")),
    Figure("docs/MHC.md", "47 MB", "fn is read once per 64 tokens",
           Calc(f"t / m * {MHC_FN} / 1e6", t=MHC_PREFILL, m=Const("overlay/deepinfer_sm80/ops/mhc/splits.py:TC_BLOCK_M"), **V41_SHAPE)),
    Figure("docs/MHC.md", "755 MB", "fn is read once per 64 tokens",
           Calc(f"t / m * {MHC_FN} / 1e6", t=MHC_PREFILL, m=Call("deepinfer_sm80.ops.mhc.splits:_shape_for_tokens", (1536,), "0"), **V41_SHAPE)),
    Figure("docs/MHC.md", "7.0", "The floor targets are missed at every T they cover",
           Calc(f"min({', '.join(f't{i}' for i in range(8))})", **MHC_FLOOR)),
    Figure("docs/MHC.md", "8.8", "The floor targets are missed at every T they cover",
           Calc(f"max({', '.join(f't{i}' for i in range(8))})", **MHC_FLOOR)),
    # docs/OPERATORS.md
    Figure("docs/OPERATORS.md", "256", "> 256 tokens per request",
           Text("overlay/deepinfer_sm80/testing/cases/topk_swa_combine.py", r'Chunk\("gt-(\d+)-per-request"')),
    Figure("docs/OPERATORS.md", "2048", "or 8 (from 2048 tokens)", Const("overlay/deepinfer_sm80/ops/kv_quant_insert.py:PREFILL_MIN_TOKENS")),
    Figure("docs/OPERATORS.md", "1 KB", "*", Calc("(n + r) * 2 / 1024", **V41_ROW)),
    *(Figure("docs/OPERATORS.md", fig, "At 1,536 / 4,096 / 8,192 tokens", Json("gpu/kv_quant_insert-h200.json", f"rows.{i}.size"))
      for fig, i in (("1,536", 12), ("4,096", 15), ("8,192", 18))),
    *(Figure("docs/OPERATORS.md", fig, "the op moves 2.5 / 6.6 / 13 MB",
             Calc("t * b / 1e6", t=Json("gpu/kv_quant_insert-h200.json", f"rows.{i}.size"),
                  b=Json("gpu/kv_quant_insert-h200.json", "results.bytes_per_token")))
      for fig, i in (("2.5", 12), ("6.6", 15), ("13 MB", 18))),
    Figure("docs/OPERATORS.md", "1,536", "under the 70 % goal at 1,536-8,192 tokens", Json("gpu/kv_quant_insert-h200.json", "rows.12.size")),
    Figure("docs/OPERATORS.md", "8,192", "under the 70 % goal at 1,536-8,192 tokens", Json("gpu/kv_quant_insert-h200.json", "rows.18.size")),
    Figure("docs/OPERATORS.md", "1,536", "where it was checked at 1,536 and 4,096 only",
           Const("overlay/deepinfer_sm80/bench/topk_swa_combine.py:SWEEP_SIZES.1")),
    Figure("docs/OPERATORS.md", "4,096", "where it was checked at 1,536 and 4,096 only",
           Const("overlay/deepinfer_sm80/bench/topk_swa_combine.py:SWEEP_SIZES.2")),
    *(Figure("docs/OPERATORS.md", fig, "at T = 1, 64 and 512 are", Json("gpu/topk_swa_combine-h200.json", f"results.shapes.{i}.timings.optimized out=.us"))
      for fig, i in (("1.53", 0), ("2.90", 2), ("1.52", 5), ("2.76", 7))),
    # docs/MODEL.md
    *model(),
    # docs/ORACLE.md
    *oracle(),
    # harness/README.md
    *harness_readme(),
    # bare numbers of 4+ digits (issue 39: figures, too)
    *bare_numbers(),
    # README.md, docs/E2E_CPU.md, docs/PIPELINE.md
    *readme(),
    *e2e_cpu(),
    *pipeline(),
)  # fmt: skip
