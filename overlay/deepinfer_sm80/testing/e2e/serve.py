"""The OpenAI server case: `vllm serve` in `server_env(level)` with `serve_args()`, as the harness starts it.

The server runs in its own session (API server + engine-core process); each prompt goes through
`/v1/completions` with token-id prompts, `return_token_ids`, `logprobs` and `prompt_logprobs=0`, and
the reply is turned into the worker's result shape so the same oracle comparison applies. Row counts
come from every process of the server (coverage.py dumps per pid at exit; the server is stopped with
SIGINT first so the dumps are written).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from deepinfer_sm80.testing.e2e import coverage, serve_args, server_env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/health", timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _prompt_logprobs(prompt: list[int], entries: list[Any] | None) -> list[float | None]:
    out: list[float | None] = []
    for i in range(1, len(prompt)):
        entry = entries[i] if entries and i < len(entries) else None
        lp = entry.get(str(prompt[i])) if entry else None
        out.append(float(lp["logprob"]) if lp is not None else None)
    return out


SPEC_COUNTERS = ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


def _spec_counters(base: str) -> dict[str, float] | None:
    """The server's draft / accepted token totals from /metrics (None without speculation), named as the
    offline worker names them (the Prometheus counters carry a `_total` suffix)."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        for counter in SPEC_COUNTERS:
            if name.split("{")[0] == counter + "_total":
                found[counter] = found.get(counter, 0.0) + float(value.split()[0])
    return found or None


def stop_group(proc: subprocess.Popen[bytes], steps: tuple[tuple[int, float], ...]) -> None:
    """Each (signal, seconds) in turn to `proc`'s process group until its leader exits."""
    for sig, wait_s in steps:
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue


def _stop(proc: subprocess.Popen[bytes]) -> None:
    stop_group(proc, ((signal.SIGINT, 30.0), (signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)))
    try:  # the engine core shares the leader's process group
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_served(
    level: str,
    model: Path,
    work: Path,
    cases: list[dict[str, Any]],
    timeout: float,
    overrides: list[str],
    name: str = "serve",
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Start the server, run the cases, stop it; the worker's output shape plus `ok`/`error`."""
    run_dir = Path(work) / "runs" / f"{name}-{level}"
    cov_dir = run_dir / "coverage"
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in cov_dir.glob("*.json"):
        old.unlink()
    port = _free_port()
    env = os.environ | server_env(level, work) | {coverage.ENV_DIR: str(cov_dir)} | (extra_env or {})
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model), *serve_args(), *overrides]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny"]
    base = f"http://127.0.0.1:{port}"
    log_path = run_dir / "server.log"
    t0 = time.perf_counter()
    deadline = t0 + timeout
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    results: list[dict[str, Any]] = []
    error = ""
    start_s = None
    spec: dict[str, float] | None = None
    try:
        while not _healthy(base):
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {proc.returncode} before /health")
            if time.perf_counter() > deadline:
                raise TimeoutError(f"vllm serve not healthy after {timeout:.0f} s")
            time.sleep(1.0)  # polling the health endpoint: there is no event to wait on
        start_s = time.perf_counter() - t0
        for case in cases:
            t = time.perf_counter()

            def ask(prompt: list[int], case: dict[str, Any] = case) -> dict[str, Any]:
                body = {
                    "model": "tiny",
                    "prompt": prompt,
                    "max_tokens": case["max_tokens"],
                    "temperature": 0.0,
                    "logprobs": 2,
                    "prompt_logprobs": 0 if case.get("prompt_logprobs", True) else None,
                    "return_token_ids": True,
                }
                reply = _post(base + "/v1/completions", body, max(deadline - time.perf_counter(), 1.0))
                choice = reply["choices"][0]
                details = (reply.get("usage") or {}).get("prompt_tokens_details")
                return {
                    "prompt": prompt,
                    "tokens": list(choice.get("token_ids") or []),
                    "prompt_logprobs": _prompt_logprobs(prompt, choice.get("prompt_logprobs"))
                    if case.get("prompt_logprobs", True)
                    else None,
                    "num_cached_tokens": int(details) if isinstance(details, int) else 0,
                }

            # a case's prompts are in flight together, as the offline engine's one generate() call has them
            with ThreadPoolExecutor(max_workers=max(1, len(case["prompts"]))) as pool:
                prompts = list(pool.map(ask, case["prompts"]))
            results.append({"name": case["name"], "prompts": prompts, "wall_s": time.perf_counter() - t})
        spec = _spec_counters(base)
    except (RuntimeError, TimeoutError, urllib.error.URLError, OSError, KeyError, ValueError) as err:
        error = f"{type(err).__name__}: {err}"
    finally:
        time.sleep(4 * coverage.DUMP_PERIOD_S)  # the last counts reach the dump files
        _stop(proc)
    rows, bound, _ = coverage.merge_dir(cov_dir)  # a served engine's drafter inputs are not compared
    for case in results:
        case["rows"] = rows  # the server's processes are counted as a whole (one dump per pid at exit)
    out: dict[str, Any] = {
        "ok": not error,
        "rc": proc.returncode,
        "wall_s": time.perf_counter() - t0,
        "log": str(log_path),
        "start": {"wall_s": start_s},
        "load_rows": rows,
        "bound": bound,
        "cases": results,
        "spec_decode": spec,
        "stage_rows": {str(k): v for k, v in coverage.merge_stages(cov_dir).items()},  # runner.stage_targets
    }
    if error:
        tail = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()][-3:]
        out["error"] = error + " | " + " | ".join(tail)
    return out
