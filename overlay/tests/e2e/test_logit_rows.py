"""logit_rows: the report's targets on synthetic rows (noise passes, a scale fails), and bad input."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
import torch

from deepinfer_sm80.testing.e2e import logit_rows
from deepinfer_sm80.testing.e2e.nll_shift import decompose, summarize


def _gen(name: str) -> torch.Generator:
    seed = zlib.crc32(name.encode())
    print(f"seed {seed} ({name})")
    return torch.Generator().manual_seed(seed)


def _per_prompt(name: str, scale: float, prompts: int = 12, n: int = 40, vocab: int = 128) -> dict:
    """Synthetic per-prompt entries: peaked rows, the 'engine' = scale * rows + N(0, 0.1^2), every oracle
    mode = rows + N(0, 0.1^2); labels uniform (independent of the rows), as the E2E prompts' are."""
    out = {}
    for k in range(prompts):
        g = _gen(f"{name}/{k}")
        x = 4.0 * torch.randn(n, vocab, generator=g, dtype=torch.float64)
        labels = torch.randint(0, vocab, (n,), generator=g)
        entry: dict = {"tokens": n + 1}
        for c in logit_rows.COMPARISONS:
            y = (scale if c == "engine" else 1.0) * x
            y = y + 0.1 * torch.randn(x.shape, generator=g, dtype=torch.float64)
            entry[c] = summarize(decompose(x, y, labels))
        out[f"extra_{k}"] = entry
    return out


def _targets(report: dict) -> dict[str, dict]:
    return {t["name"]: t for t in report["targets"]}


def test_noise_alone_meets_the_independent_prompt_targets() -> None:
    report = logit_rows.build_report(_per_prompt("noise", 1.0))
    t = _targets(report)
    assert t["engine/independent_prompts/residual_abs_z"]["met"]
    assert t["engine/independent_prompts/scale_abs_z"]["met"]
    eng = report["independent"]["engine"]
    assert eng["prompts"] == 12 and eng["predicted_shift"] > 0  # noise raises the mean NLL a little


def test_a_logit_scale_fails_them() -> None:
    report = logit_rows.build_report(_per_prompt("scale", 1.01))
    t = _targets(report)
    assert not t["engine/independent_prompts/residual_abs_z"]["met"]
    assert not t["engine/independent_prompts/scale_abs_z"]["met"]
    assert report["independent"]["engine"]["observed"]["mean"] > 0  # deep-tail labels: the NLL rises


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (["--lengths", "2"], "at least 3 tokens"),
        (["--extra", "-1"], "at least 3 tokens"),
        (["--rows", "/nonexistent/rows.pt"], "no such file"),
        (["--model", "/nonexistent/ckpt"], "no such checkpoint directory"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], msg: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = Path("/nonexistent/out.json")
    assert logit_rows.main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and err.count("\n") == 0
    assert not out.exists()


def test_render_prints_every_prompt_and_comparison(tmp_path: Path) -> None:
    per = _per_prompt("render", 1.0, prompts=3, n=10, vocab=32)
    per["short_12"] = per["extra_0"] | {"tokens": 12}
    report = logit_rows.build_report(per)
    text = logit_rows.render(report)
    assert "| short_12 (12) |" in text and "| 3 independent prompts" in text
    assert all(f"| {c} |" in text for c in logit_rows.COMPARISONS)
    bad = tmp_path / "other.json"
    bad.write_text("{}")
    assert logit_rows.main(["--render", str(bad)]) == 2
