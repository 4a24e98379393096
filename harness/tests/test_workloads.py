"""Issue 23 defect 8: prompts are windows of real, non-repeating text (prose, Python code, a
ShareGPT file), never one page tiled; a workload too short for a prompt is one line."""

import json

import pytest

from deepinfer_harness.cells import Cell, format_cell, parse_cell
from deepinfer_harness.cli import main
from deepinfer_harness.prompts import TokenCorpus
from deepinfer_harness.workloads import CorpusError, text_pieces, workload_text


def distinct_share(words, k=24):
    """Share of k-word passages that are distinct: ~1 for real text (licence headers and the like
    repeat a little), ~1/copies for a tiled page (the old corpus: 162K tokens = ~180 copies)."""
    grams = [tuple(words[i : i + k]) for i in range(len(words) - k + 1)]
    return len(set(grams)) / len(grams)


def test_a_prompt_is_a_window_never_a_tiling():
    corpus = TokenCorpus(ids=list(range(1000)), canary_ids=[1], text_sha256="x")
    for index in range(12):
        p = corpus.prompt(300, index)
        assert len(p) == 300 and p == list(range(p[0], p[0] + 300))  # consecutive: no wrap, no tile
    assert corpus.prompt(300, 0) != corpus.prompt(300, 1) != corpus.prompt(300, 5)
    assert len({tuple(corpus.prompt(300, i)) for i in range(20)}) == 20  # distinct past the text's end
    with pytest.raises(ValueError, match="fewer than a prompt of 1001"):
        corpus.prompt(1001, 0)  # the old corpus tiled 3,979 characters ~180 times for 162K


@pytest.mark.parametrize("workload", ["prose", "code"])
def test_workload_text_does_not_repeat(workload):
    text = workload_text(workload, 400_000)
    assert len(text) >= 400_000
    words = text.split()
    assert distinct_share(words) > 0.98
    assert distinct_share((words[:2000]) * 20) < 0.06  # what the measure says of a tiled text
    if workload == "code":
        assert "# file: Lib/" in text and "def " in text
    else:
        assert sum(c.isalpha() or c.isspace() for c in text) > 0.8 * len(text)
    assert workload_text(workload, 400_000) == text  # fixed order: both arms, every session


def test_text_pieces_keep_every_character():
    text = workload_text("prose", 300_000)
    pieces = text_pieces(text, 50_000)
    assert "".join(pieces) == text and len(pieces) > 4 and max(map(len, pieces)) < 120_000


def test_sharegpt_file(tmp_path):
    rows = [
        {"conversations": [{"from": "human", "value": f"question {i} " * 20}, {"from": "gpt", "value": "a"}]}
        for i in range(50)
    ]
    jsonl = tmp_path / "s.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    text = workload_text("sharegpt", 10**6, jsonl)
    assert "question 49" in text and "\n\na" not in text  # human turns only
    listed = tmp_path / "s.json"
    listed.write_text(json.dumps(rows))
    assert workload_text("sharegpt", 10**6, listed) == text
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(CorpusError, match="not ShareGPT JSON or JSONL"):
        workload_text("sharegpt", 100, bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"conversations": [{"from": "gpt", "value": "x"}]}))
    with pytest.raises(CorpusError, match="no human turns"):
        workload_text("sharegpt", 100, empty)


def test_cell_ids_name_the_workload():
    cell = Cell("decode", 3072, 512, 8, "code")
    assert format_cell(cell) == "decode-i3k-o512-c8-wcode" and parse_cell("decode-i3k-o512-c8-wcode") == cell
    assert parse_cell("nll-i2k") == Cell("nll", 2048)  # prose: no suffix
    with pytest.raises(ValueError, match="non-canonical"):
        parse_cell("nll-i2k-wprose")


def test_corpus_flag_and_too_short_workloads_are_one_line(tmp_path, capsys):
    base = [
        "bench-ab",
        "--profile",
        "smoke",
        "--results",
        str(tmp_path / "r"),
        "--dry-run",
        "--skip-check",
        "ports",
    ]
    rows = [{"conversations": [{"from": "human", "value": "short"}]}]
    small = tmp_path / "small.jsonl"
    small.write_text(json.dumps(rows[0]))
    assert main([*base, "--corpus", str(small)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: workload sharegpt:") and "fewer than its largest prompt" in err
    big = tmp_path / "big.jsonl"
    big.write_text(
        "\n".join(
            json.dumps({"conversations": [{"from": "human", "value": f"w{i} " * 400}]}) for i in range(20)
        )
    )
    assert main([*base, "--corpus", str(big)]) == 0
    out = capsys.readouterr().out
    assert "nll-i256-wsharegpt" in out and "sharegpt " in out
    assert main([*base, "--set", "plan.decode.workloads=[poetry]"]) == 2
    assert "allowed workloads" in capsys.readouterr().err


def test_acceptance_is_reported_per_workload():
    from deepinfer_harness.analysis.report import acceptance_by_workload

    def run(cell, variant, al, valid=True):
        return {"kind": "decode", "cell_id": cell, "variant": variant, "spec_decode_acceptance_length": al,
                "validity": {"valid": valid}}  # fmt: skip

    runs = [
        run("decode-i3k-o512-c1", "A", 3.0),
        run("decode-i3k-o512-c8", "A", 2.0),
        run("decode-i3k-o512-c1-wcode", "A", 4.0),
        run("decode-i3k-o512-c1-wcode", "B", 4.5),
        run("decode-i3k-o512-c1-wcode", "B", 9.0, valid=False),  # never averaged in
    ]
    rows = {r["workload"]: r for r in acceptance_by_workload(runs)}
    assert rows["prose"]["A"] == {"mean": 2.5, "runs": 2} and rows["prose"]["B"] == {"mean": None, "runs": 0}
    assert rows["code"]["B"] == {"mean": 4.5, "runs": 1}
