"""A missed target's cause is written from the run it belongs to (issue 31): the bench code that builds
the targets of mHC and the top-k/SWA combiner, fed a synthetic result, names what that result measured
and nothing it did not (no tensor-core claim the config contradicts, no sweep that did not run, no
fixed "~2 us")."""

import re

import pytest

pytest.importorskip("torch")

from deepinfer_sm80.bench import mhc
from deepinfer_sm80.bench import topk_swa_combine as combine
from deepinfer_sm80.ops.mhc import splits
from deepinfer_sm80.testing.bench import Ceilings, Row

LAUNCH = 0.7


def _mhc_inputs(sweeps: list[dict[str, object]]):
    us_by_t = {
        1: {"deepinfer": 9.0, "upstream": 10.0, "floor": 1.2},
        16: {"deepinfer": 14.0, "upstream": 11.0, "floor": 1.5},
        1536: {"deepinfer": 101.0, "upstream": 296.0, "floor": 38.0},
    }
    rows = [Row("mhc_post_pre", "deepinfer", "h5120", 1536, 101.0, 1600.0, 37.6, 38.0, "close")]
    configs = {t: splits.partials_config(t, 5120, 132, tensor_cores=True) for t in us_by_t}
    return mhc.targets_of(us_by_t, rows, configs, sweeps, LAUNCH)


def _causes(targets) -> dict[str, str]:
    return {t.name: t.cause for t in targets if not t.met}


def test_mhc_causes_name_the_kernel_that_ran_and_a_sweep_only_where_one_ran():
    causes = _causes(_mhc_inputs([]))
    copy = causes["T=1536: % of copy bandwidth"]
    assert "tensor-core partials (64 tokens per CTA" in copy and "no tensor-core path" not in copy
    assert "101.0 us vs a floor of 38.0 us" in copy
    slower = causes["T=16: ours / upstream's selection"]
    assert "ours 14.0 us vs upstream 11.0 us with CUDA-core partials (block_m 2" in slower
    assert "no config sweep ran at this T" in slower and "see sweep" not in slower
    floor = causes["T=1: ours / floor"]
    assert "9.0 us vs a floor of 1.20 us" in floor and "0.70 us" in floor
    assert "7.1 us beyond the bytes and two empty launches" in floor  # 9.0 - (1.2 - 0.7) - 2 x 0.7
    assert not any("see sweep" in c or "yet" in c for c in causes.values())


def test_mhc_causes_quote_the_sweep_when_it_ran():
    cfg = splits.PartialsConfig(4, 128, 10, 2, n_groups=2)
    sweeps = [{"T": 16, "config": cfg.__dict__, "us": 10.5}, {"T": 16, "config": cfg.__dict__, "us": 12.0}]
    slower = _causes(_mhc_inputs(sweeps))["T=16: ours / upstream's selection"]
    assert "the sweep's fastest, CUDA-core partials (block_m 4, 128 threads, 10 splits" in slower
    assert "took 10.5 us" in slower
    none_faster = _causes(_mhc_inputs([{"T": 16, "config": cfg.__dict__, "us": 20.0}]))
    assert "none of the 1 swept configs was faster" in none_faster["T=16: ours / upstream's selection"]


def _combine_shape(T: int, us: float, nbytes: int, floor: float) -> dict[str, object]:
    return {
        "T": T,
        "ratio": 1,
        "bytes_moved": nbytes,
        "timings": {"optimized out=": {"us": us}},
        "speedups": {"out_over_floor": round(us / floor, 2)},
    }


def test_combine_cause_is_the_measured_times_not_a_fixed_figure():
    ceilings = Ceilings(copy_gbps=4000.0, empty_launch_us=LAUNCH)
    shapes = [
        _combine_shape(T, us, nbytes, ceilings.floor_us(nbytes))
        for T, us, nbytes in ((1, 1.5, 4_000), (512, 2.9, 2_400_000), (4096, 6.7, 19_000_000))
    ]
    (target,) = combine.targets_of(shapes, ceilings)
    assert not target.met and "T=512" in target.name
    cause = target.cause
    assert "~2 us" not in cause
    assert "at T=512 the kernel took 2.90 us against a floor of 1.30 us" in cause  # 2.4 MB / 4 TB/s + 0.7
    assert "at T = 1, 512, whose bytes take less than one empty launch" in cause  # not 4096 (4.75 us)
    assert re.search(r"took 1\.50-2\.90 us \(2\.1-4\.1x the empty launch\)", cause), cause
