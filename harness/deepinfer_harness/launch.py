"""Exact server command lines per arm: vLLM serve args, `docker run`, local command or URL.

Pure functions of the profile so that `--dry-run` and unit tests see the same argv that `run`
executes. Flags every arm gets are the ones the harness's metrics depend on (HARNESS.md §1.1).
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field

from deepinfer_harness.config import Profile

# Flags the harness relies on: per-request cached tokens, the response `metrics` object,
# one SSE event per engine step, prompt-logprob depth and raw logprobs for the NLL cells.
HARNESS_FLAGS = ["--enable-prompt-tokens-details", "--enable-per-request-metrics",
                 "--stream-interval", "1", "--max-logprobs", "20", "--logprobs-mode", "raw_logprobs"]
SERVE_MODULE = ["-m", "vllm.entrypoints.openai.api_server"]


@dataclass(frozen=True)
class Launch:
    variant: str
    kind: str  # local | docker | url
    base_url: str
    argv: list[str] = field(default_factory=list)  # empty for url
    env: dict[str, str] = field(default_factory=dict)  # added to the harness's environment
    serve_args: list[str] = field(default_factory=list)
    stop_argv: list[str] = field(default_factory=list)  # run after killing the group (docker rm -f)
    nice: int = 0

    def describe(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = shlex.join(self.argv) if self.argv else f"(already running at {self.base_url})"
        nice = f"(nice {self.nice}) " if self.nice else ""
        return f"[{self.variant}] {nice}{env + ' ' if env else ''}{cmd}"


def serve_args(profile: Profile, model: str, port: int) -> list[str]:
    topo = profile.topology
    args = ["--model", model, "--host", profile.server.host, "--port", str(port),
            "--max-model-len", str(profile.max_model_len),
            "--tensor-parallel-size", str(topo.tp), "--pipeline-parallel-size", str(topo.pp)]
    if profile.served_model_name:
        args += ["--served-model-name", profile.served_model_name]
    if profile.dtype:
        args += ["--dtype", profile.dtype]
    if profile.kv_cache_dtype:
        args += ["--kv-cache-dtype", profile.kv_cache_dtype]
    if profile.speculative:
        args += ["--speculative-config", json.dumps(profile.speculative, sort_keys=True),
                 "--per-request-spec-decode-metrics", "summary"]
    if topo.ray:
        args += ["--distributed-executor-backend", "ray"]
    return args + HARNESS_FLAGS + list(profile.serve_flags)


def serve_env(profile: Profile, variant: str) -> dict[str, str]:
    env = {"VLLM_SERVER_DEV_MODE": "1"}  # /reset_prefix_cache and /server_info
    if profile.topology.pp_partition:
        env["VLLM_PP_LAYER_PARTITION"] = ",".join(map(str, profile.topology.pp_partition))
    return env | profile.env | profile.server.env | profile.server.variant_env.get(variant, {})


def container_name(run_id: str, variant: str, session: int) -> str:
    return f"deepinfer-bench-{run_id}-{variant.lower()}{session}"


def build_launch(profile: Profile, variant: str, model: str, run_id: str, session: int) -> Launch:
    srv = profile.server
    if srv.mode == "url":
        return Launch(variant, "url", srv.urls[variant].rstrip("/"))
    port = srv.ports[variant]
    base_url = f"http://{srv.host}:{port}"
    args = serve_args(profile, model, port)
    env = serve_env(profile, variant)
    if srv.mode == "local":
        argv = [sys.executable if part == "{python}" else part for part in srv.command] + args
        return Launch(variant, "local", base_url, argv, env, args, nice=srv.nice)
    name = container_name(run_id, variant, session)
    docker = ["docker", "run", "--rm", "--name", name, "--gpus", "all", "--ipc=host", "--network=host"]
    if model.startswith("/"):  # a local checkpoint is mounted at the same path; a hub id is not
        docker += ["-v", f"{model}:{model}:ro"]
    for key, value in sorted(env.items()):
        docker += ["-e", f"{key}={value}"]
    docker += [*srv.docker_args, "--entrypoint", "python3", srv.images[variant], *SERVE_MODULE, *args]
    return Launch(variant, "docker", base_url, docker, {}, args, ["docker", "rm", "-f", name], srv.nice)
