"""Discovery: every module that defines COMPILE_SPECS is found and was compiled by the committed report;
specs derive their Triton signatures from the kernels' own parameter lists."""

import importlib
import json
import pkgutil
from pathlib import Path
from typing import Any

import pytest
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

import deepinfer_sm80
from deepinfer_sm80.bench import bench_modules
from deepinfer_sm80.device import BUDGETS
from deepinfer_sm80.registry import (
    POINTER_SUFFIX,
    CompileSpec,
    all_specs,
    kernel_modules,
    kernel_params,
    signature,
    tilelang_specs,
)

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


# ----------------------------------------------------------------------------- signature / CompileSpec
def _toy(x_ptr, BLOCK: tl.constexpr, n, out, eps, FLAG: tl.constexpr):
    pass  # never compiled: only its parameter list is read


def _toy_forms() -> list[Any]:
    """The same kernel as the JIT holds it and as the interpreter (TRITON_INTERPRET=1) does."""
    return [JITFunction(_toy), InterpretedFunction(_toy)]


@pytest.mark.parametrize("fn", _toy_forms(), ids=["jit", "interpreter"])
def test_signature_is_in_argument_order_with_constexprs_where_the_kernel_has_them(fn):
    sig = signature(fn, {"x_ptr": "bf16", "out": "fp32"}, eps="fp32")
    assert list(sig.items()) == [
        ("x_ptr", "*bf16"),
        ("BLOCK", "constexpr"),
        ("n", "i32"),
        ("out", "*fp32"),  # no `_ptr` suffix: a pointer because `pointers` names it
        ("eps", "fp32"),
        ("FLAG", "constexpr"),
    ]
    assert list(signature(fn, "u8", scalars="i64")) == list(fn.arg_names)
    assert signature(fn, "u8", scalars="i64")["x_ptr"] == "*u8"
    assert signature(fn, "u8", scalars="i64")["out"] == "i64"  # not named a pointer: a scalar


@pytest.mark.parametrize(
    ("pointers", "types", "error"),
    [
        ({"out": "fp32"}, {}, "pointer 'x_ptr' has no dtype"),
        ({"x_ptr": "bf16", "y_ptr": "bf16"}, {}, r"pointers names \['y_ptr'\], not arguments"),
        ("bf16", {"epsilon": "fp32"}, r"types names \['epsilon'\], not arguments"),
        ({"x_ptr": "bf16", "BLOCK": "i32"}, {}, r"pointers names \['BLOCK'\], constexpr"),
        ("bf16", {"FLAG": "i1"}, r"types names \['FLAG'\], constexpr"),
        ("bf16", {"x_ptr": "i64"}, r"types names pointers \['x_ptr'\]"),
        ("*bf16", {}, r"\['\*bf16'\] are not element/scalar types"),
    ],
)
def test_signature_names_what_it_cannot_type(pointers, types, error):
    with pytest.raises(ValueError, match=f"_toy: {error}"):
        signature(JITFunction(_toy), pointers, **types)


def test_compile_spec_signature_must_name_exactly_the_kernels_arguments():
    fn = JITFunction(_toy)
    sig = signature(fn, "bf16")
    CompileSpec("toy", fn, dict(reversed(sig.items())), {"BLOCK": 64})  # any order: Triton matches by name
    lacking = {k: v for k, v in sig.items() if k != "eps"}
    with pytest.raises(ValueError, match=r"toy: signature of _toy lacks \['eps'\], has extra \[\]"):
        CompileSpec("toy", fn, lacking)
    with pytest.raises(ValueError, match=r"lacks \[\], has extra \['y_ptr'\]"):
        CompileSpec("toy", fn, {**sig, "y_ptr": "*bf16"})


def test_compile_spec_constexpr_values_only_for_constexpr_arguments():
    fn = JITFunction(_toy)
    sig = signature(fn, "bf16")
    with pytest.raises(ValueError, match=r"toy: constexpr values for runtime arguments \['n'\]"):
        CompileSpec("toy", fn, sig, {"BLOCK": 64, "n": 1})
    # a runtime argument the signature specialises (the JIT's None / literal 1, as the kernel trace
    # records it) may carry its value
    CompileSpec("toy", fn, {**sig, "n": "constexpr"}, {"BLOCK": 64, "n": 1})
    with pytest.raises(ValueError, match=r"toy: \['gamma'\] not in the signature"):
        CompileSpec("toy", fn, sig, {"gamma": 1})


def test_kernel_params_read_the_same_from_the_jit_and_the_interpreter():
    # the specs are built at import, under TRITON_INTERPRET=1 in the CPU tests and without it in the
    # report: both readings of every shipped kernel's parameters must agree
    kernels = {id(s.fn): getattr(s.fn, "fn", s.fn) for s in all_specs()}
    assert len(kernels) >= 20, len(kernels)
    for py in kernels.values():
        assert kernel_params(JITFunction(py)) == kernel_params(InterpretedFunction(py)), py.__name__


def test_shipped_specs_follow_their_kernels_parameter_lists():
    for spec in all_specs():
        params = kernel_params(spec.fn)
        assert list(spec.signature) == [n for n, _ in params], spec.name
        for name, is_constexpr in params:
            assert (spec.signature[name] == "constexpr") == is_constexpr, (spec.name, name)
            if name.endswith(POINTER_SUFFIX):
                assert spec.signature[name].startswith("*"), (spec.name, name)
