"""Issue 30 defect 2: `--corpus` reaches every cell (rate, chat and shared-prefix cells kept the
built-in prose), and a ShareGPT file is used per conversation where a cell can take one, with its
own turns and lengths: chat cells send whole conversations, rate cells with a length range send
each conversation's first user turn and its reply's length; every other cell fixes its prompt
length, takes windows of the joined user turns and says so in one line."""

import json

from pydantic import BaseModel

from deepinfer_harness.cli import main
from deepinfer_harness.config import Plan
from deepinfer_harness.layout import RunKey, RunLayout, read_json
from deepinfer_harness.prompts import sha256_ids
from deepinfer_harness.records import read_records
from deepinfer_harness.run.cell import hash_text

from .test_pipeline_fake import bench, write_profile

ALL_KINDS = [
    "plan.rate={rates: [2, .inf], isl: {min: 8, max: 64}, osl: {min: 2, max: 16}, n: 4}",
    "plan.shared_prefix=[{prefix: 48, isl: 64, osl: 4, n: 2, c: 1}]",
    "plan.chat={isl: 128, osl: 4, concurrencies: [1], n: 2, thinking: false}",
    "plan.long_decode={isl: 64, osl: 64, concurrencies: [1]}",
    "plan.ttft_isls=[64]",
    "plan.nll=[{isl: 64, docs: 1}]",
]


def conversation(i: int, human_words: int, reply_words: int, extra_turns: int = 0) -> dict:
    turns = [{"from": "system", "value": "be brief"}] if i % 4 == 3 else []
    for t in range(extra_turns):
        turns += [
            {"from": "human", "value": f"earlier{t} q{i} " * 3},
            {"from": "gpt", "value": f"ok{t} " * 2},
        ]
    turns += [{"from": "human", "value": " ".join(f"h{i}w{j}" for j in range(human_words))}]
    turns += [{"from": "gpt", "value": " ".join(f"a{i}w{j}" for j in range(reply_words))}]
    return {"id": f"c{i}", "conversations": turns}


def corpus_file(tmp_path, rows):
    path = tmp_path / "sharegpt.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_every_workload_field_of_the_plan_is_switched_by_corpus():
    """The override list derives from one declaration, which names every workload field the plan has."""
    from deepinfer_harness.cli import SHAREGPT_OVERRIDES
    from deepinfer_harness.config import WORKLOAD_FIELDS

    def workload_fields(cls, prefix):
        for name, info in cls.model_fields.items():
            if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
                yield from workload_fields(info.annotation, f"{prefix}{name}.")
            elif "workload" in name:
                yield f"{prefix}{name}"

    assert set(workload_fields(Plan, "plan.")) == set(WORKLOAD_FIELDS)
    assert {o.split("=")[0] for o in SHAREGPT_OVERRIDES} == set(WORKLOAD_FIELDS)


def test_corpus_reaches_every_cell_kind(tmp_path, capsys):
    rows = [conversation(i, 10 + i, 4) for i in range(40)]
    args = ["cells", "--profile", "smoke", "--corpus", str(corpus_file(tmp_path, rows))]
    assert main([*args, *(x for s in ALL_KINDS for x in ("--set", s))]) == 0
    ids = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()]
    kinds = {i.split("-")[0] for i in ids}
    assert {"rate", "prefix", "chat", "decode", "nll", "greedy", "ttft", "prefill"} <= kinds, ids
    assert all(i.endswith("-wsharegpt") for i in ids), [i for i in ids if not i.endswith("-wsharegpt")]


def test_every_cell_says_in_one_line_how_it_uses_the_corpus(tmp_path, capsys):
    rows = [conversation(i, 10 + i, 4) for i in range(40)]
    base = ["bench-ab", "--profile", "smoke", "--results", str(tmp_path / "r"), "--dry-run"]
    base += ["--skip-check", "ports", "--skip-check", "model", "--corpus", str(corpus_file(tmp_path, rows))]
    assert main([*base, *(x for s in ALL_KINDS for x in ("--set", s))]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("# --corpus ")]
    said = {line.split(" → ", 1)[1].split(": ", 1)[0]: line.split(": ", 1)[1] for line in lines}
    cells = {line.split()[1] for line in out.splitlines() if line.startswith("  client: ")}
    assert cells and set(said) == cells and len(lines) == len(cells)  # one line per cell
    assert said["chat-i128-o4-c1-wsharegpt"].startswith("one conversation per request: its own turns")
    assert said["rate-i36-o9-r2-poisson-wsharegpt"].startswith(
        "one conversation per request: its first user turn"
    )
    assert "its reply's length" in said["rate-i36-o9-rinf-poisson-wsharegpt"]
    for cell in ("prefix-i64-p48-o4-c1-wsharegpt", "nll-i64-wsharegpt", "ttft-i64-c1-wsharegpt"):
        assert said[cell].startswith("windows of the joined user turns") and "exactly 64 tokens" in said[cell]
    # a rate plan with a fixed ISL cannot use a conversation's own length: windows, and why
    assert main([*base, "--set", "plan.rate={rates: [2], isl: 32, osl: 4, n: 4}"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if " → rate-" in x)
    assert "windows of the joined user turns" in line and "exactly 32 tokens" in line


def words(text):
    return len(text.split())


def test_chat_and_rate_cells_send_whole_conversations_with_their_own_lengths(fake, tmp_path):
    """The fake server's tokenizer makes one token per word and its chat template adds 3."""
    rows = [
        conversation(0, 70, 4),  # rate: a first user turn of 70 > 64 tokens; chat: 73 > 60
        conversation(1, 12, 3, extra_turns=1),  # rate: first user turn of 6 < 8; chat: 3 turns, 23
        conversation(2, 9, 30),  # rate: a reply of 30 > 16 tokens; chat: 12
        *(conversation(i, 8 + 3 * i, 2 + i) for i in range(3, 9)),  # 3 and 7 open with a system turn
        {"conversations": [{"from": "gpt", "value": "no user turn"}]},
    ]
    plan = {
        "prefill": {"isls": [], "n": 2, "concurrent": []},
        "decode": {"isl": 16, "osl": 4, "concurrencies": []},
        "greedy": {"isl": 32, "osl": 4, "concurrencies": [1], "n": 2},
        "rate": {"rates": [float("inf")], "isl": {"min": 8, "max": 64}, "osl": {"min": 2, "max": 16}, "n": 4},
        "chat": {"isl": 60, "osl": 4, "concurrencies": [1], "n": 2, "thinking": False},
    }
    profile = write_profile(tmp_path, fake.url, plan=plan)
    assert bench(tmp_path, profile, "--no-charts", "--corpus", str(corpus_file(tmp_path, rows))) == 0
    layout = RunLayout(tmp_path / "results" / "fake")
    summary = read_json(layout.summary)
    assert summary["n_invalid"] == 0, [r["validity"] for r in summary["runs"] if not r["validity"]["valid"]]
    stored = read_json(layout.conversations())
    # rate: 4 measured requests and 1 warm-up, one conversation each, in file order
    assert [c["index"] for c in stored["rate"]] == [3, 4, 5, 6, 7]
    turns = {i: [t for t in r["conversations"] if t["from"] != "system"] for i, r in enumerate(rows)}
    want = [(i, words(turns[c][0]["value"]), words(turns[c][1]["value"])) for i, c in enumerate([3, 4, 5, 6])]
    cell = "rate-i36-o9-rinf-poisson-wsharegpt"
    for variant, rep in (("A", 0), ("B", 0), ("B", 1), ("A", 1)):
        recs = read_records(layout.run_file(RunKey(cell, variant, rep), "jsonl"))
        got = sorted((r.index, r.prompt_len, r.max_tokens) for r in recs if r.phase == "measure")
        assert got == want, (variant, rep, got)  # its own prompt length and its reply's length
    # chat: one conversation per request, its own turns (a system turn and earlier turns included)
    # up to its last user turn, rendered within the cell's 60 tokens; the warm-up is the third
    chosen = stored["chat"]
    assert [c["index"] for c in chosen] == [1, 2, 3]
    assert [m["role"] for m in chosen[0]["messages"]] == ["user", "assistant", "user"]
    assert [m["role"] for m in chosen[2]["messages"]] == ["system", "user"]
    recs = read_records(layout.run_file(RunKey("chat-i60-o4-c1-wsharegpt", "B", 1), "jsonl"))
    by_index = {r.index: r for r in recs if r.phase == "measure"}
    for i, conv in enumerate(chosen[:2]):
        assert by_index[i].prompt_sha256 == sha256_ids([hash_text(m["content"]) for m in conv["messages"]])
        assert by_index[i].prompt_len == 3 + sum(words(m["content"]) for m in conv["messages"])
    # the fixed-length cells cut windows of the joined user turns
    assert read_json(layout.corpus("sharegpt"))["source"] == str(tmp_path / "sharegpt.jsonl")
