"""nll_shift: the exact split of a prompt's NLL shift, and what it says on synthetic rows of known noise."""

from __future__ import annotations

import zlib

import pytest
import torch

from deepinfer_sm80.testing.e2e.nll_shift import across, decompose, gaussian_prediction, summarize


def _gen(name: str) -> torch.Generator:
    seed = zlib.crc32(name.encode())
    print(f"seed {seed} ({name})")
    return torch.Generator().manual_seed(seed)


def _rows(name: str, n: int = 4000, vocab: int = 256, spread: float = 2.0) -> torch.Tensor:
    return spread * torch.randn(n, vocab, generator=_gen(name), dtype=torch.float64)


def _labels(name: str, n: int, lo: int, hi: int) -> torch.Tensor:
    return torch.randint(lo, hi, (n,), generator=_gen(name + "/labels"))


def test_the_three_terms_add_up_to_the_observed_shift_and_ignore_a_row_constant() -> None:
    x = _rows("split", n=64)
    y = x + 0.7 * torch.randn(x.shape, generator=_gen("split/noise"), dtype=torch.float64)
    labels = _labels("split", 64, 2, 200)
    parts = decompose(x, y, labels, (2, 200))
    total = parts["curvature"] + parts["first_order"] + parts["label"]
    assert torch.allclose(total, parts["observed"], atol=1e-12, rtol=0)
    assert bool((parts["curvature"] >= 0).all())  # a KL divergence

    # the observed shift from its definition, per position
    def nll(z: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(z, -1) - z.gather(1, labels[:, None]).squeeze(1)

    assert torch.allclose(parts["observed"], nll(y) - nll(x), atol=1e-12, rtol=0)
    shifted = decompose(x, y + torch.arange(64, dtype=torch.float64)[:, None], labels, (2, 200))
    for key in ("observed", "curvature", "first_order", "label", "scale"):
        assert torch.allclose(shifted[key], parts[key], atol=1e-9, rtol=0), key


def test_gaussian_noise_of_known_sd_raises_the_mean_nll_by_the_predicted_amount() -> None:
    sd = 0.3
    x = _rows("gauss")
    y = x + sd * torch.randn(x.shape, generator=_gen("gauss/noise"), dtype=torch.float64)
    labels = _labels("gauss", x.shape[0], 0, x.shape[1])  # independent of the rows
    s = summarize(decompose(x, y, labels))
    want = gaussian_prediction(x, sd)
    assert want > 0.02  # the rows are flat enough that the effect is many SE from zero
    obs = s["observed"]
    assert abs(obs["mean"] - want) < 3 * obs["se"], (obs, want)
    assert obs["mean"] > 3 * obs["se"]  # and the shift itself is positive, as the theory says
    # the measured curvature is the prediction up to O(sd^3), and the residual is noise
    assert s["curvature"]["mean"] == pytest.approx(want, rel=0.05)
    assert s["quadratic"]["mean"] == pytest.approx(want, rel=0.05)
    assert abs(s["residual"]["z"]) < 3
    assert abs(s["scale"]["mean_scale"] - 1.0) < 3 * s["scale"]["se"]


def test_a_logit_scale_lands_in_the_first_order_term_not_in_the_noise_prediction() -> None:
    x = _rows("scale", n=200)
    y = 1.01 * x + 1e-3 * torch.randn(x.shape, generator=_gen("scale/noise"), dtype=torch.float64)
    labels = _labels("scale", 200, 0, x.shape[1])
    s = summarize(decompose(x, y, labels))
    assert s["scale"]["mean_scale"] == pytest.approx(1.01, abs=1e-4)
    assert s["first_order"]["mean"] == pytest.approx(0.01 * s["peak_height_mean"], rel=0.01)
    assert s["scale_for_first_order"] == pytest.approx(1.01, abs=1e-3)
    assert s["residual"]["z"] > 3  # the shift is systematic, and the statistic says so
    assert s["curvature"]["mean"] < 0.1 * s["first_order"]["mean"]


def test_across_prompts_takes_the_spread_of_the_per_prompt_means() -> None:
    x = _rows("across", n=10 * 16, vocab=64)
    y = x + 0.2 * torch.randn(x.shape, generator=_gen("across/noise"), dtype=torch.float64)
    labels = _labels("across", x.shape[0], 0, 64)
    sums = [summarize(decompose(x[k::10], y[k::10], labels[k::10])) for k in range(10)]
    out = across(sums)
    means = torch.tensor([s["observed"]["mean"] for s in sums], dtype=torch.float64)
    assert out["prompts"] == 10
    assert out["observed"]["mean"] == pytest.approx(float(means.mean()), abs=1e-12)
    assert out["observed"]["se"] == pytest.approx(float(means.std() / 10**0.5), rel=1e-9)
    assert out["predicted_shift"] == pytest.approx(sum(s["curvature"]["mean"] for s in sums) / 10, abs=1e-12)


@pytest.mark.parametrize(
    ("shape_y", "labels", "support", "msg"),
    [
        ((3, 9), [1, 2, 3], None, "decompose: x"),
        ((3, 8), [1, 2, 3], (2, 8), "outside support"),
        ((3, 8), [1, 2, 8], None, "outside support"),
    ],
)
def test_bad_input_is_one_clear_error(
    shape_y: tuple[int, int], labels: list[int], support: tuple[int, int] | None, msg: str
) -> None:
    x = torch.zeros(3, 8)
    with pytest.raises(ValueError, match=msg):
        decompose(x, torch.zeros(shape_y), torch.tensor(labels), support)


def test_a_non_finite_row_is_refused() -> None:
    y = torch.zeros(2, 4)
    y[1, 2] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        decompose(torch.zeros(2, 4), y, torch.tensor([0, 1]))
