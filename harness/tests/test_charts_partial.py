"""Issue 23 defect 7: charts and tables of a partial run say what is missing instead of drawing
`nan×` labels, zero-height bars or empty panels; numbers print without exponents."""

import matplotlib.pyplot as plt
import pandas as pd

from deepinfer_harness.analysis.charts import charts_for_run, prefill_by_isl, throughput_ab
from deepinfer_harness.analysis.report import fmt, side
from deepinfer_harness.layout import write_json

LABELS = {"A": "A: base", "B": "B: deepinfer"}


def arm(estimate, runs):
    return {
        "estimate": estimate,
        "sd": None,
        "n_valid": len(runs),
        "runs": runs,
        "reps": list(range(len(runs))),
    }


def rows():
    full = {"cell_id": "decode-i64-o32-c1", "metric": "decode_tok_s", "a": arm(10.0, [9.0, 11.0])}
    full |= {
        "b": arm(12.0, [12.0, 12.0]),
        "ratio": 1.2,
        "ci_low": None,
        "ci_high": None,
        "n_pairs": 2,
        "mark": "?",
    }
    partial = {"cell_id": "decode-i64-o32-c4", "metric": "decode_tok_s", "a": arm(20.0, [20.0])}
    partial |= {"b": arm(None, []), "ratio": None, "ci_low": None, "ci_high": None, "n_pairs": 0, "mark": "!"}
    return pd.DataFrame([full, partial])


def test_missing_arm_gets_a_note_not_a_bar_and_no_nan_label():
    fig = throughput_ab(rows(), LABELS)
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert len(heights) == 3 and all(h > 0 for h in heights)  # A, B of cell 1; A of cell 2
    texts = [t.get_text() for t in ax.texts]
    assert not any("nan" in t for t in texts), texts
    assert "B: no valid run" in texts and any(t.startswith("1.20× ?") for t in texts)
    assert ax.get_ylabel() == "decode tok/s"  # short: the long caption sits under the title
    plt.close(fig)


def test_isl_ticks_are_plain_integers():
    runs = pd.DataFrame(
        [
            {
                "kind": "prefill-cold",
                "concurrency": 1,
                "isl": isl,
                "variant": v,
                "median_ttft_ms": 1.0 + i,
                "prefill_tok_s": 100.0,
            }
            for i, isl in enumerate([128, 1024, 65536])
            for v in "AB"
        ]
    )
    fig = prefill_by_isl(runs, LABELS)
    fig.canvas.draw()
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["128", "1k", "64k"]
    plt.close(fig)


def test_no_nll_chart_from_greedy_pairs_alone(tmp_path):
    run = tmp_path / "run"
    summary = {"runs": [], "provenance": {"labels": {}, "note": None}}
    numerics = [
        {"cell_id": "greedy-i16-o4-c1", "kind": "greedy", "ab": [{"greedy_exact_match_rate": 1.0}], "aa": []}
    ]
    write_json(run / "summary.json", summary)
    write_json(run / "ab.json", {"rows": [], "numerics": numerics})
    assert charts_for_run(run, tmp_path / "charts") == []


def test_numbers_print_without_exponents():
    assert fmt(140.3, 2) == "140" and fmt(0.085, 2) == "0.085" and fmt(4.789) == "4.79"
    assert fmt(32000.0) == "32,000" and fmt(0.0) == "0" and fmt(float("nan")) == "n/a"
    assert side({"estimate": 12626.0, "sd": 210.4, "n_valid": 2}) == "12,626 ± 210 (n=2)"
