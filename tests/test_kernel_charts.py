"""Kernel charts stay legible (<= 8 series a panel, eager and graph apart) and re-run identical."""

import json

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
