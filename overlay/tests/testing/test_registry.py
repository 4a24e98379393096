"""Discovery: every module that defines COMPILE_SPECS is found and was compiled by the committed report."""

import importlib
import json
import pkgutil
from pathlib import Path

import deepinfer_sm80
from deepinfer_sm80.bench import bench_modules
from deepinfer_sm80.device import BUDGETS
from deepinfer_sm80.registry import all_specs, kernel_modules, tilelang_specs

REPORT = Path(__file__).resolve().parents[3] / "results" / "sm80-compile.json"


def _all_modules() -> list[str]:
    pkg = deepinfer_sm80.__path__
    names = [m.name for m in pkgutil.walk_packages(pkg, prefix="deepinfer_sm80.")]
    return [n for n in names if not n.startswith(("deepinfer_sm80.integration", "deepinfer_sm80.bench"))]


def test_every_module_with_compile_specs_is_discovered():
    defining = {n for n in _all_modules() if hasattr(importlib.import_module(n), "COMPILE_SPECS")}
    assert defining <= set(kernel_modules()), (
        f"COMPILE_SPECS outside ops/: {sorted(defining - set(kernel_modules()))}"
    )


def test_committed_report_compiled_every_spec():
    compiled = {(k["name"], k["arch"]) for k in json.loads(REPORT.read_text())["kernels"]}
    wanted = {(s.name, arch) for s in [*all_specs(), *tilelang_specs()] for arch in BUDGETS}
    missing = sorted(wanted - compiled)
    assert not missing, (
        f"run `make sm80-report`: {len(missing)} specs not in {REPORT.name}, e.g. {missing[:5]}"
    )


def test_spec_names_are_unique():
    names = [s.name for s in all_specs()]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_every_bench_is_named_after_an_op():
    ops = {m.name for m in pkgutil.iter_modules(importlib.import_module("deepinfer_sm80.ops").__path__)}
    benches = [n.rsplit(".", 1)[1] for n in bench_modules()]
    assert {"kv_gather", "kv_quant_insert", "topk_swa_combine"} <= set(benches)
    assert not [b for b in benches if b not in ops], f"benches without an ops/<op>: {benches}, ops: {ops}"
