"""The numeric certificate's NLL rule: per document, z = mean(d_t) / (SD(d_t)/√n) over the signed
per-position differences d_t = NLL_B,t − NLL_A,t, so rounding noise of two kernels (large per
position, zero on average) passes while a systematic shift (small, the same at every position)
fails; the per-document |mean| stays as a gross guard. Everything is re-derived from the records."""

import hashlib
import json
import math

import numpy as np
import pytest

from deepinfer_harness.analysis.ab import CellRuns, numeric_certificate, numerics
from deepinfer_harness.analysis.reader import RunReader
from deepinfer_harness.analysis.stats import mean_shift
from deepinfer_harness.cli import main
from deepinfer_harness.layout import RunKey, RunLayout, read_json
from deepinfer_harness.records import JsonlWriter, RequestRecord

from .test_pipeline_fake import PLAN, bench, write_profile

CELL = "nll-i201"  # 201 prompt tokens: 200 scored positions (the first token has no logprob)
POSITIONS = 200


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little"))


def _write_run(layout: RunLayout, variant: str, docs: list[list[float]]) -> None:
    layout.run_file(RunKey(CELL, variant, 0), "jsonl").parent.mkdir(parents=True, exist_ok=True)
    with JsonlWriter(layout.run_file(RunKey(CELL, variant, 0), "jsonl")) as out:
        for index, lp in enumerate(docs):
            plp = {"n": POSITIONS + 1, "lp": lp, "top1": [7] * len(lp), "rank": [1] * len(lp)}
            out.write(
                RequestRecord(CELL, variant, 0, 0, index, prompt_len=POSITIONS + 1, prompt_logprobs=plp)
            )


def certificate(tmp_path, shifts: list[np.ndarray], tolerances: dict[str, float]) -> dict:
    """Documents whose A logprobs sit at -20..-40 (the tiny V4.1 head) and whose B logprobs are
    moved by d_t per position (NLL_B,t = NLL_A,t + d_t); one A/B pair, certified."""
    rng = _rng("base logprobs")
    base = [rng.uniform(-40.0, -20.0, POSITIONS) for _ in shifts]
    layout = RunLayout(tmp_path / "run")
    _write_run(layout, "A", [list(map(float, b)) for b in base])
    _write_run(layout, "B", [list(map(float, b - d)) for b, d in zip(base, shifts, strict=True)])
    valid = {"validity": {"valid": True}}
    cell = CellRuns(CELL, "nll", {("A", 0): valid, ("B", 0): valid}, [("A", 0), ("B", 0)])
    return numeric_certificate([numerics(RunReader(layout), cell)], tolerances)


def by_metric(cert: dict) -> dict[str, dict]:
    return {c["metric"]: c for c in cert["checks"]}


def alternating(n: int, sd: float) -> np.ndarray:
    """±a with sample SD exactly `sd` and mean 0 (n even)."""
    return np.array([1.0, -1.0] * (n // 2)) * sd * math.sqrt((n - 1) / n)


def test_a_constant_shift_of_005_nats_fails_the_z_rule_though_the_gross_guard_passes(tmp_path):
    shift = 0.05 + alternating(POSITIONS, 0.02)  # every position 0.05 worse, SD 0.02
    cert = certificate(tmp_path, [shift, shift], {"nll_doc_z": 3.0, "nll_doc_abs": 0.5})
    checks = by_metric(cert)
    z = checks["doc_dnll_z_abs_max"]
    assert z["measured"] == pytest.approx(0.05 / (0.02 / math.sqrt(POSITIONS)), rel=1e-6)  # 35.4
    assert z["met"] is False and z["tolerance"] == "nll_doc_z" and z["unit"] == "standard errors"
    assert z["worst"]["dnll_mean"] == pytest.approx(0.05) and z["worst"]["positions"] == POSITIONS
    assert z["worst"]["se"] == pytest.approx(0.02 / math.sqrt(POSITIONS))
    assert checks["doc_dnll_abs_max"]["met"] is True  # 0.05 ≤ 0.5: only the z test sees it
    assert cert["status"] == "fail"


def test_zero_mean_noise_of_sd_05_passes_the_z_rule_and_fails_a_002_abs_rule(tmp_path):
    """Noise of SD 0.5 per position (the committed tiny V4.1 run's size) whose document mean lands
    one standard error from 0, as a zero-mean draw typically does: |mean| 0.035 > 0.02."""
    se = 0.5 / math.sqrt(POSITIONS)
    draws = []
    for k in range(2):
        x = _rng(f"noise {k}").standard_normal(POSITIONS)
        x = (x - x.mean()) / x.std(ddof=1) * 0.5  # SD exactly 0.5
        draws.append(x + (se if k == 0 else -0.5 * se))
    assert all(abs(d.mean()) > 0.01 for d in draws)
    noise = by_metric(certificate(tmp_path / "z", draws, {"nll_doc_z": 3.0, "nll_doc_abs": 0.5}))
    assert noise["doc_dnll_z_abs_max"]["measured"] == pytest.approx(1.0, rel=1e-6)
    assert noise["doc_dnll_z_abs_max"]["met"] is True and noise["doc_dnll_abs_max"]["met"] is True
    assert noise["doc_dnll_z_abs_max"]["worst"]["index"] == 0
    old = certificate(tmp_path / "abs", draws, {"nll_doc_abs": 0.02})
    assert old["status"] == "fail" and by_metric(old)["doc_dnll_abs_max"]["measured"] == pytest.approx(se)
    assert [c["metric"] for c in old["checks"]] == ["doc_dnll_abs_max"]  # only declared tolerances decide


def test_every_declared_nll_tolerance_must_hold(tmp_path):
    """A shift far beyond the gross guard with noise large enough to keep z small: the guard fails."""
    shift = 0.8 + alternating(POSITIONS, 20.0)  # z = 0.8 / (20/√200) = 0.57
    cert = certificate(tmp_path, [shift], {"nll_doc_z": 3.0, "nll_doc_abs": 0.5})
    checks = by_metric(cert)
    assert checks["doc_dnll_z_abs_max"]["met"] is True and checks["doc_dnll_abs_max"]["met"] is False
    assert cert["status"] == "fail"
    assert by_metric(certificate(tmp_path / "none", [shift], {}))["doc_dnll_abs_max"]["met"] is None


def test_mean_shift_edge_cases():
    assert mean_shift([0.0, 0.0, 0.0]).z == 0.0  # A/A: bitwise equal
    assert mean_shift([0.1, 0.1]).z == math.inf and mean_shift([-0.1, -0.1]).z == -math.inf
    one = mean_shift([0.3])
    assert one.z is None and one.se is None and one.mean == 0.3
    s = mean_shift([1.0, 2.0, 3.0, 6.0])
    sd = math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + 0 + (6 - 3) ** 2) / 3)
    assert s.mean == 3.0 and s.sd == pytest.approx(sd) and s.z == pytest.approx(3.0 / (sd / 2))
    assert mean_shift([1.0, 2.0], mean=1.25).z == pytest.approx(1.25 / (math.sqrt(0.5) / math.sqrt(2)))


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("-1", "ab.numerics.nll_doc_z = -1.0: must be >= 0"),
        (".nan", "ab.numerics.nll_doc_z = nan: must be finite"),
        (".inf", "ab.numerics.nll_doc_z = inf: must be finite"),
        ("soon", "ab.numerics.nll_doc_z = 'soon': expected number"),
        ("true", "ab.numerics.nll_doc_z = True: expected number"),
    ],
)
def test_bad_nll_doc_z_is_one_line_and_exit_2(capsys, tmp_path, value, needle):
    rc = main(["validate", "--profile", "tiny-v41", "--set", f"ab.numerics.nll_doc_z={value}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("error: ") and needle in err, err
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text("{}")
    rc = main(["report", str(run), "--numerics", f"{{nll_doc_z: {value}}}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and f"--numerics: {needle}" in err, err


def test_a_finished_run_is_recertified_from_its_records_alone(fake, tmp_path, capsys):
    """`report RUN --numerics …` re-derives the certificate from the JSONL prompt logprobs (no
    server): the run as measured (A = B) is ok; B's records shifted 0.05 nats at every position
    fail the z rule, and ab.md lists each document's mean, SE and z."""
    plan = {**PLAN, "decode": {**PLAN["decode"], "concurrencies": []}, "ttft_isls": []}
    plan |= {
        "prefill": {"isls": [], "n": 2, "concurrent": []},
        "greedy": {**PLAN["greedy"], "concurrencies": []},
    }
    assert bench(tmp_path, write_profile(tmp_path, fake.url, plan=plan), "--no-charts") == 0
    root = tmp_path / "results" / "fake"
    tolerances = "{nll_doc_z: 3.0, nll_doc_abs: 0.5}"
    assert main(["report", str(root), "--numerics", tolerances]) == 0
    cert = read_json(root / "ab.json")["numeric_certificate"]
    assert cert["status"] == "ok" and cert["tolerances_declared"] == "after the run (report --numerics)"
    assert cert["tolerances_of_the_run"] == {}
    assert by_metric(cert)["doc_dnll_z_abs_max"]["measured"] == 0.0  # identical logprobs: z = 0

    for path in (root / "cells" / "nll-i64").glob("B.r*.jsonl"):
        lines = []
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            lp = rec["prompt_logprobs"]["lp"]
            rec["prompt_logprobs"]["lp"] = [x - 0.05 - 0.01 * (i % 2) for i, x in enumerate(lp)]
            lines.append(json.dumps(rec))
        path.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(["report", str(root), "--numerics", tolerances]) == 0
    err = capsys.readouterr().err
    cert = read_json(root / "ab.json")["numeric_certificate"]
    checks = by_metric(cert)
    assert cert["status"] == "fail" and checks["doc_dnll_z_abs_max"]["met"] is False
    assert checks["doc_dnll_abs_max"]["met"] is True  # 0.055 nats/token is inside the gross guard
    assert checks["doc_dnll_z_abs_max"]["worst"]["dnll_mean"] == pytest.approx(0.055, abs=0.001)
    assert "numeric parity certificate: fail (tolerances given after the run" in err
    assert "doc_dnll_z_abs_max" in err and "NOT MET" in err
    md = (root / "ab.md").read_text()
    assert "| pair | doc | positions | ΔNLL mean (B − A) | SD | SE | z |" in md
    summary = read_json(root / "summary.json")
    names = {t["name"]: t for t in summary["targets"]}
    assert names["A/B doc_dnll_z_abs_max nll-i64"]["met"] is False
