"""Counts the calls that reach each binding row during a CPU end-to-end run.

`install()` (from `standins.install`, before vLLM is imported) wraps `bindings.rebind`: after the real
hook binds a module's rows, every bound object (ours, or upstream's own where a row keeps it at this
level) is replaced by a counting proxy. A run then asserts `counts()[row] > 0` for every row its case
must reach, so a silent bypass (vLLM's CPU dispatch to `SparseAttnIndexer.forward_cpu`, a row that
never binds) fails instead of passing with upstream's code.

Counts are per process; `dump()` writes them to $DEEPINFER_E2E_COVERAGE_DIR/<pid>.json at exit so the
OpenAI-server case (API server + engine-core processes) can add them up (`merge_dir`).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV_DIR = "DEEPINFER_E2E_COVERAGE_DIR"
COUNTS: Counter[str] = Counter()
BOUND: dict[str, str] = {}  # row -> target bound in this process ("upstream" = upstream's own)
_INSTALLED: list[bool] = []


class _CountingLaunch:
    """Proxy for a Triton kernel object: counts `kernel[grid](...)` launches, forwards the rest."""

    def __init__(self, name: str, kernel: Any) -> None:
        self._e2e_row, self._e2e_kernel = name, kernel

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        launch = self._e2e_kernel[grid]

        def counted(*args: Any, **kwargs: Any) -> Any:
            COUNTS[self._e2e_row] += 1
            return launch(*args, **kwargs)

        return counted

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        COUNTS[self._e2e_row] += 1
        return self._e2e_kernel(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._e2e_kernel, attr)


# The drafter's input, per token of every real step (not profile or dummy runs): the model returns
# (hidden, aux states) where speculation reads aux states; [position, sha256 of the token's aux rows in
# slot order]. The PP engines' list must equal the single-stage engine's (runner.aux_target).
AUX: list[list[Any]] = []
AUX_ROW = "pp_forward"  # the row bound on DeepseekV4Model.forward at every level (PP or not)


def _record_aux(result: Any, args: tuple[Any, ...]) -> None:
    import hashlib

    from deepinfer_sm80.integration.pp.engine import _step_metadata

    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], list) and result[1]):
        return
    if _step_metadata() is None:
        return
    positions = args[2].tolist()
    rows = [a[: len(positions)].contiguous().view(-1, a.shape[-1]) for a in result[1]]
    for t, pos in enumerate(positions):
        h = hashlib.sha256()
        for r in rows:
            h.update(r[t].detach().float().cpu().numpy().tobytes())  # bf16 -> fp32 is exact
        AUX.append([int(pos), h.hexdigest()[:16]])


def counting(name: str, obj: Any) -> Any:
    """`obj` with every call (or kernel launch) counted under `name`."""
    if isinstance(obj, type):
        return obj  # a class (e.g. the attention class a factory returns) is counted where it is made
    if hasattr(obj, "__getitem__") and not callable(getattr(obj, "__get__", None)):
        return _CountingLaunch(name, obj)
    if hasattr(obj, "__getitem__") and hasattr(obj, "fn"):  # triton JITFunction
        return _CountingLaunch(name, obj)
    if not callable(obj):
        return obj

    @functools.wraps(obj)
    def counted(*args: Any, **kwargs: Any) -> Any:
        COUNTS[name] += 1
        result = obj(*args, **kwargs)
        if name == AUX_ROW:
            _pp_stage()  # the model's forward: this process runs a stage, and its group is up
            _record_aux(result, args)
        return result

    counted._e2e_row = name  # type: ignore[attr-defined]
    return counted


def install() -> None:
    if _INSTALLED:
        return
    _INSTALLED.append(True)
    from deepinfer_sm80 import bindings

    real = bindings.rebind

    def rebind(namespace: Any, module_name: str) -> dict[str, str | None]:
        chosen = real(namespace, module_name)
        for row in bindings.rows_for(module_name):
            if row.name not in chosen:
                continue
            current = bindings._get(namespace, row.symbol)
            if getattr(current, "_e2e_row", None) == row.name:
                continue
            bindings._set(namespace, row.symbol, counting(row.name, current))
            BOUND[row.name] = chosen[row.name] or "upstream"
        return chosen

    bindings.rebind = rebind  # the patch-00 hook line imports `rebind` when the module runs
    if os.environ.get(ENV_DIR):
        atexit.register(dump)
        # vLLM's engine core exits on SIGTERM without running atexit: a daemon thread also writes
        # the counts every DUMP_PERIOD_S while they change (serve.py waits longer before stopping).
        threading.Thread(target=_dump_loop, name="e2e-coverage-dump", daemon=True).start()


DUMP_PERIOD_S = 0.5


def _dump_loop() -> None:
    last: dict[str, int] = {}
    while True:
        time.sleep(DUMP_PERIOD_S)
        now = dict(COUNTS)
        if now != last:
            dump()
            last = now


def counts() -> dict[str, int]:
    return dict(COUNTS)


def snapshot() -> Counter[str]:
    return Counter(COUNTS)


def since(before: Counter[str]) -> dict[str, int]:
    """Calls per row since `before` (a snapshot()), rows with none left out."""
    return {k: v - before.get(k, 0) for k, v in COUNTS.items() if v - before.get(k, 0) > 0}


def dump(directory: str | None = None) -> Path | None:
    target = directory or os.environ.get(ENV_DIR)
    if not target:
        return None
    path = Path(target) / f"{os.getpid()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    data = {"counts": dict(COUNTS), "bound": BOUND, "aux": AUX, "stage": _pp_stage()}
    tmp.write_text(json.dumps(data, sort_keys=True))
    tmp.replace(path)  # a reader never sees half a file
    return path


_STAGE: list[int] = []  # this process's pipeline stage, once seen (vLLM tears its groups down before atexit)


def _pp_stage() -> int | None:
    """This process's pipeline stage (None where no model runs: the engine core, the API server)."""
    import sys

    if _STAGE:
        return _STAGE[0]
    ps = sys.modules.get("vllm.distributed.parallel_state")
    group = getattr(ps, "_PP", None) if ps is not None else None
    if group is None:
        return None
    _STAGE.append(int(group.rank_in_group))
    return _STAGE[0]


def merge_stages(directory: Path) -> dict[int, dict[str, int]]:
    """Row counts per pipeline stage, summed over that stage's processes (its TP ranks); processes that
    run no stage (engine core, API server) are left out. A required row is judged on the stage that
    holds its layer (runner.stage_targets), never on the sum over stages."""
    out: dict[int, Counter[str]] = {}
    for path in sorted(Path(directory).glob("*.json")):
        data = json.loads(path.read_text())
        if data.get("stage") is not None:
            out.setdefault(int(data["stage"]), Counter()).update(data["counts"])
    return {stage: dict(c) for stage, c in sorted(out.items())}


def merge_dir(directory: Path) -> tuple[dict[str, int], dict[str, str], list[list[Any]]]:
    """Row counts summed over every process's dump, the rows bound, and the drafter-input digests of the
    last stage (every TP rank there returns the same aux states: the hidden states are replicated across
    TP ranks after each all-reduce; ranks that disagree are an error)."""
    total: Counter[str] = Counter()
    bound: dict[str, str] = {}
    found: list[list[list[Any]]] = []
    for path in sorted(Path(directory).glob("*.json")):
        data = json.loads(path.read_text())
        total.update(data["counts"])
        bound.update(data["bound"])
        if data.get("aux"):
            found.append(data["aux"])
    if any(f != found[0] for f in found[1:]):
        raise ValueError(f"{directory}: the last stage's {len(found)} TP ranks recorded different aux states")
    return dict(total), bound, found[0] if found else []


def missing(required: list[str], got: dict[str, int]) -> list[str]:
    """The required rows with no call."""
    return [row for row in required if got.get(row, 0) <= 0]
