"""Kernel charts stay legible (<= 8 series a panel, eager and graph apart) and re-run identical."""

import json
from pathlib import Path

import kernel_charts as kc


def _rows(op: str, shapes: list[str], impls: list[str]) -> list[dict]:
    return [
        {"op": op, "impl": impl, "shape": shape, "size": size, "us": 10.0 * (1 + i) + size, "gbps": None,
         "pct_of_copy": None, "floor_us": None, "verdict": "n/a"}
        for i, impl in enumerate(impls) for shape in shapes for size in (1, 4)
    ]  # fmt: skip


def test_panels_hold_at_most_eight_series_and_whole_shapes():
    series = [(i, f"s{k}") for k in range(6) for i in ("base", "deepinfer", "upstream")]
    groups = kc.panels(series)
    assert all(len(g) <= kc.MAX_SERIES for g in groups) and sum(map(len, groups)) == 18
    for g in groups:  # a shape's impls sit in one panel
        assert all(sum(s == shape for _, s in g) in (0, 3) for shape in {s for _, s in series})


def test_eager_and_graph_are_separate_bars():
    assert kc._group("dspark_draft", "chain5-greedy-eager") == "dspark_draft (eager)"
    assert kc._group("dspark_draft", "chain5-gumbel-perstep-graph") == "dspark_draft (graph)"
    assert kc._group("kv_gather", "bs128") == "kv_gather"


def test_rerun_identical_and_orphans_removed(tmp_path):
    res, out = tmp_path / "gpu", tmp_path / "charts"
    res.mkdir()
    out.mkdir()
    (out / "orphan.svg").write_text("<svg/>")
    rows = _rows("dspark_draft", ["chain5-greedy-eager", "chain5-greedy-graph"], ["deepinfer", "upstream"])
    (res / "d.json").write_text(json.dumps({"provenance": {"gpu": "G", "git_sha": "abc"}, "rows": rows}))
    assert kc.main([str(res), str(out)]) == 0
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "orphan.svg" not in first and {"dspark_draft.svg", "speedups.svg"} <= set(first)
    assert kc.main([str(res), str(out)]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first


# ----------------------------------------------------------------------------- issue 31: charts that answer
RESULTS_GPU = Path(__file__).resolve().parent.parent / "results" / "gpu"


def _row(op: str, impl: str, shape: str, size: int, us: float) -> dict:
    return {"op": op, "impl": impl, "shape": shape, "size": size, "us": us}


def _legend(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]


def test_subfolder_runs_fill_only_the_ops_the_top_level_lacks(tmp_path):
    (tmp_path / "run").mkdir()
    top = {"provenance": {"date": "1"}, "rows": [_row("x", "deepinfer", "s", 1, 1.0)]}
    rows = [_row("x", "deepinfer", "s", 1, 2.0), _row("y", "deepinfer", "s", 1, 3.0)]
    newer = {"bench": "b", "provenance": {"date": "2"}, "rows": rows}
    no_bench = {"provenance": {"date": "3"}, "rows": [_row("z", "deepinfer", "s", 1, 4.0)]}
    (tmp_path / "a.json").write_text(json.dumps(top))
    (tmp_path / "run" / "b.json").write_text(json.dumps(newer))
    (tmp_path / "run" / "c.json").write_text(json.dumps(no_bench))
    by_op, runs = kc.load_runs(tmp_path)
    assert {op: run.name for op, run in runs.items()} == {"x": "a.json", "y": "run/b.json"}
    assert by_op["x"][0]["us"] == 1.0


def test_speedups_show_the_indexer_logits_slower_included_and_the_mhc_bench():
    by_op, runs = kc.load_runs(RESULTS_GPU)
    assert runs["mhc_post_pre"].name == "mhc-bench-31b5269/mhc-h200.json"  # in a subfolder
    ratios = kc.speedup_ratios(by_op)
    logits = ratios[("indexer_decode_logits", "upstream ROCm Triton (not DeepGEMM)", "upstream")]
    assert (round(min(logits), 2), round(max(logits), 2)) == (0.47, 1.43)  # ours over upstream's, both ways
    assert {g for g, _, _ in ratios} >= {"mhc_post_pre", "mhc_pre_first", "mhc_post", "indexer_decode_logits"}
    fig = kc.speedup_figure(by_op, {op: r.label for op, r in runs.items()})
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert any(t.startswith("indexer_decode_logits vs upstream") for t in ticks)
    assert not any(t.startswith("mhc") for t in ticks)  # timed, not shipped: README says so
    assert "not drawn (timed, not shipped" in fig.axes[0].get_title()
    kc.plt.close(fig)


def test_every_run_label_names_gpu_and_versions():
    _, runs = kc.load_runs(RESULTS_GPU)
    for run in runs.values():
        assert "NVIDIA H200 sm_90 | torch 2.11.0+cu130 | triton 3.6.0 | git " in run.label, run.label


def test_kv_gather_lines_are_distinct_and_an_overlap_is_said():
    rows = [_row("kv_gather", impl, "bs128", n, us * n) for n in (4096, 16384, 131072)
            for impl, us in (("deepinfer", 1.0), ("base", 5.0), ("upstream", 5.02))]  # fmt: skip
    fig = kc.op_figure("kv_gather", rows, "label")
    lines = fig.axes[0].get_lines()
    styles = {(ln.get_linestyle(), ln.get_marker(), ln.get_color()) for ln in lines}
    assert len(lines) == 3 and len(styles) == 3
    assert len({ln.get_linestyle() for ln in lines}) == 3 and len({ln.get_marker() for ln in lines}) == 3
    legend = _legend(fig)
    assert any(t.startswith("base: SM80 port of upstream's kernel") for t in legend)
    assert any(t.startswith("upstream vLLM 0.32.0") and "lines overlap" in t for t in legend)
    kc.plt.close(fig)


def test_an_op_timed_at_one_size_is_bars():
    rows = [_row("sparse_mla_prefill", impl, shape, 1536, us) for shape in ("h16-ctx16k", "h32-ctx16k")
            for impl, us in (("deepinfer", 1.0), ("base", 2.0), ("upstream", 3.0))]  # fmt: skip
    fig = kc.op_figure("sparse_mla_prefill", rows, "label")
    (ax,) = fig.axes
    assert not ax.get_lines() and len(ax.patches) == 6
    kc.plt.close(fig)


def test_one_implementation_is_not_charted():
    rows = [_row("indexer_prefill_cand_only", "deepinfer", "q8", n, 1.0) for n in (1, 2)]
    assert kc.op_figure("indexer_prefill_cand_only", rows, "label") is None


def test_indexer_charts_one_meaning_of_base_and_like_shapes():
    by_op, _ = kc.load_runs(RESULTS_GPU)
    fig = kc.op_figure("indexer_decode_logits", by_op["indexer_decode_logits"], "label")
    legend = _legend(fig)
    assert any(t.startswith("DeepInfer SM80 paged logits") for t in legend)  # the bench's `base` row is ours
    assert not any(t.startswith("base") or t.startswith("dense") for t in legend)
    kc.plt.close(fig)
    prefill = [r for op in kc.CHART_OF for r in by_op[op]]
    fig = kc.op_figure("indexer_prefill", prefill, "label")
    drawn = [ln.get_label() for ax in fig.axes for ln in ax.get_lines()]
    assert drawn and not any("q2048" in label for label in drawn)  # 1M dense ran 2048 queries, streamed 8192
    assert "left out" in fig.get_suptitle() and "q2048" in fig.get_suptitle()
    bars = fig.axes[-1]  # the single-point candidate timings beside the streamed and dense ones at 64K
    assert len(bars.patches) == 5 and bars.get_xticklabels()[0].get_text().startswith("q8192")
    kc.plt.close(fig)


def test_indexer_workspace_is_the_recorded_one_against_context():
    by_op, runs = kc.load_runs(RESULTS_GPU)
    fig = kc.workspace_figure(runs, by_op)
    values = {float(y) for ax in fig.axes for ln in ax.get_lines() for y in ln.get_ydata()}
    res = runs["indexer_prefill_topk"].results
    assert (
        res["prefill_64K"]["dense_workspace_mb"] in values
        and res["prefill_1024K"]["stream_workspace_mb"] in values
    )
    assert (
        res["prefill_1024K"]["dense_workspace_mb"] not in values
    )  # 2048 queries: not the streamed case's 8192
    assert res["decode_1024K_r48"]["stream_workspace_mb"] in values
    assert "measured, not from a formula" in fig.get_suptitle()
    kc.plt.close(fig)


# ----------------------------------------------------------------------------- issue 39: titled panels
def test_every_panel_of_every_chart_has_a_title():
    by_op, runs = kc.load_runs(RESULTS_GPU)
    stems = []
    for stem, fig in kc.figures(by_op, runs):
        stems.append(stem)
        untitled = [i for i, ax in enumerate(fig.axes) if not ax.get_title().strip()]
        kc.plt.close(fig)
        assert not untitled, f"{stem}: panels {untitled} have no title"
    assert {"sparse_mla_decode", "dspark_draft", "speedups"} <= set(stems)


def test_sparse_mla_decode_draws_128k_as_the_points_the_json_holds():
    by_op, _ = kc.load_runs(RESULTS_GPU)
    rows = by_op["sparse_mla_decode"]
    timed = sorted({r["size"] for r in rows if r["shape"].endswith("ctx128k")})
    fig = kc.chart_figure("sparse_mla_decode", rows, "label")
    assert len(fig.axes) == 3  # 8, 16 and 32 heads
    for ax in fig.axes:
        heads = ax.get_title().split()[0]
        assert ax.get_title().startswith(f"{heads} heads (16K: Tq 1–48; 128K: Tq 6, 24, 48 only)")
        long = [ln for ln in ax.get_lines() if ln.get_label().endswith("ctx128k")]
        assert len(long) == 3 and all(ln.get_linestyle() == "None" for ln in long)  # points, no line
        assert all(sorted(ln.get_xdata()) == timed for ln in long)  # nothing filled in
    assert "128K context was timed at Tq 6, 24, 48 only" in fig.get_suptitle()
    kc.plt.close(fig)


def test_dspark_draft_is_faceted_by_mode_and_sampler_with_the_legend_off_the_data():
    by_op, _ = kc.load_runs(RESULTS_GPU)
    rows = by_op["dspark_draft"]
    fig = kc.chart_figure("dspark_draft", rows, "label")
    titles = sorted(ax.get_title() for ax in fig.axes)
    assert len(titles) == 4 and all(("greedy" in t) != ("gumbel" in t) for t in titles)
    assert sum("eager" in t for t in titles) == 2 and sum("CUDA graph" in t for t in titles) == 2
    assert all(len(ax.get_lines()) <= 5 for ax in fig.axes)
    assert sum(len(ax.get_lines()) for ax in fig.axes) == len({(r["shape"], r["impl"]) for r in rows})
    assert not any(ax.get_legend() for ax in fig.axes) and len(fig.legends) == 1  # one, below the panels
    assert kc.dspark_series("dspark_draft", "deepinfer", "chain5-gumbel-perstep-graph") == (
        "graph", "gumbel", "all K = 5 positions: DeepInfer per-step path (default)"
    )  # fmt: skip
    kc.plt.close(fig)
