"""manifest.json: provenance, cell definitions and schedule; resume refuses changed definitions."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from deepinfer_harness import SCHEMA_VERSION, __version__
from deepinfer_harness.config import Profile, profile_dict
from deepinfer_harness.layout import RunLayout, read_json, write_json
from deepinfer_harness.parity import certificate
from deepinfer_harness.plan import CellDef, Session
from deepinfer_harness.prompts import text_sha256
from deepinfer_harness.strict_json import dumps


class DefinitionMismatch(RuntimeError):
    pass


SHOWN_CHANGES = 6


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """{'plan.rate.ramps[0].end_rps': 8.0, …}: every leaf of a profile by its dotted field name."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out |= _flat(item, f"{prefix}.{key}" if prefix else str(key))
        return out or {prefix: {}}
    if isinstance(value, list) and value:
        out = {}
        for i, item in enumerate(value):
            out |= _flat(item, f"{prefix}[{i}]")
        return out
    return {prefix: value}


def profile_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`plan.prefill.n (2 → 3)` for every field whose value differs between two profiles."""
    before, after = _flat(old), _flat(new)
    out = []
    for name in sorted(before.keys() | after.keys()):
        a, b = before.get(name, "absent"), after.get(name, "absent")
        if a != b:
            out.append(f"{name} ({json.dumps(a)} → {json.dumps(b)})")
    return out


def check_resume(layout: RunLayout, profile: Profile) -> None:
    """One profile per run: resuming with any field changed (a `--set`, an edited YAML) would run
    with one profile and report with another, so it is refused, naming the fields."""
    if not layout.manifest.exists():
        return
    old = read_json(layout.manifest).get("profile")
    new = json.loads(dumps(profile_dict(profile)))
    changes = profile_changes(old if isinstance(old, dict) else {}, new)
    if changes:
        more = f", and {len(changes) - SHOWN_CHANGES} more" if len(changes) > SHOWN_CHANGES else ""
        raise DefinitionMismatch(
            f"{layout.root}: the profile's definitions changed since the run began: "
            f"{'; '.join(changes[:SHOWN_CHANGES])}{more}; one profile per run: resume with the profile "
            "and --set flags it began with, or use a new --run-id or --fresh"
        )


def _poisson_note(changed: list[str]) -> str:
    """Why a recorded `-poisson` cell no longer resumes: the name moved to vLLM's process."""
    if not any(i.startswith("rate-") and "-poisson-" in f"{i}-" for i in changed):
        return ""
    return (
        " (`poisson` is vllm bench serve's process since the harness took its definition; these "
        "runs sent the former one, now `poisson0`: harness/README, Arrival processes)"
    )


def _sweep_note(gone: list[str]) -> str:
    if not any(i.startswith("rate-") and "max-" in i for i in gone):
        return ""
    return "; its sweep was anchored at k/N of the all-at-once throughput, now GuideLLM's S to T"


def git_sha(where: Path) -> str | None:
    res = subprocess.run(
        ["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return res.stdout.strip() or None


def host_id() -> str:
    """Stable identity of the client host (name, machine-id, CPU, RAM): a run never resumes across hosts."""
    parts = [platform.node()]
    sources = (("/etc/machine-id", None), ("/proc/cpuinfo", "model name"), ("/proc/meminfo", "MemTotal"))
    for path, key in sources:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        lines = [ln for ln in text.splitlines() if key is None or ln.startswith(key)]
        parts.append(lines[0] if lines else "")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def foreign_host(layout: RunLayout) -> str | None:
    """The host id an existing run was started on, if it is not this host."""
    if not layout.manifest.exists():
        return None
    other = read_json(layout.manifest).get("harness", {}).get("host_id")
    return other if other and other != host_id() else None


CLIENT_DISTS = ("aiohttp", "pandas", "numpy", "scipy", "matplotlib", "pyyaml")


def client_hardware() -> str:
    """The client host in words (the servers' GPUs are per session, from nvidia-smi)."""
    cpu = ""
    try:
        cpu = next(
            (
                ln.split(":", 1)[1].strip()
                for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")
            ),
            "",
        )
    except OSError:
        pass
    return (
        f"client {platform.machine()} {cpu or platform.processor()} ({os.cpu_count()} logical cores)".strip()
    )


def model_fingerprint(model: str) -> str | None:
    """A local checkpoint's identity: config.json's bytes and every file's name, size and mtime
    (hashing the weights would read hundreds of GB); None for a hub id or a URL-served model."""
    path = Path(model).expanduser()
    if not path.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(path.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    config = path / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    return h.hexdigest()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def init_manifest(
    layout: RunLayout,
    profile: Profile,
    cells: list[CellDef],
    sessions: list[Session],
    run_id: str,
    model: str,
    note: str | None,
) -> dict[str, Any]:
    cell_rows = [
        {
            "cell_id": c.id,
            "kind": c.cell.kind,
            "isl": c.cell.isl,
            "osl": c.cell.osl,
            "concurrency": c.cell.concurrency,
            "n": c.n,
            "definition_sha256": c.definition_sha256,
        }
        for c in cells
    ]
    if layout.manifest.exists():
        old = read_json(layout.manifest)
        old_defs = {c["cell_id"]: c["definition_sha256"] for c in old["cells"]}
        new_defs = {c["cell_id"]: c["definition_sha256"] for c in cell_rows}
        changed = sorted(k for k in old_defs.keys() & new_defs.keys() if old_defs[k] != new_defs[k])
        stamp = old.get("model_fingerprint")
        if stamp and stamp != model_fingerprint(model):
            raise DefinitionMismatch(
                f"{layout.root}: the checkpoint {model} changed since the run began (files or config.json); "
                "use a new --run-id or --fresh"
            )
        gone, added = sorted(old_defs.keys() - new_defs.keys()), sorted(new_defs.keys() - old_defs.keys())
        if gone or added:  # the same profile planned other cells: this harness plans them otherwise
            raise DefinitionMismatch(
                f"{layout.root}: this harness plans other cells for the run's profile than it recorded "
                f"(recorded only: {gone[:3] or 'none'}; planned only: {added[:3] or 'none'}"
                f"{_sweep_note(gone)}); use a new --run-id or --fresh"
            )
        if changed or old.get("model") != model:
            raise DefinitionMismatch(
                f"{layout.root}: cell definitions or model changed since the run began "
                f"({changed or 'model'}); use a new --run-id or --fresh{_poisson_note(changed)}"
            )
        old["cells"] = cell_rows
        return old
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "started_at": time.time(),
        "ended_at": None,
        "model": model,
        "model_fingerprint": model_fingerprint(model),
        "note": note,
        "harness": {
            "version": __version__,
            "git_sha": git_sha(Path(__file__).parent),
            "python": sys.version.split()[0],
            "aiohttp": _version("aiohttp"),
            "corpus_text_sha256": text_sha256(),
            "host_id": host_id(),
            "hardware": client_hardware(),
            "command": shlex.join([Path(sys.orig_argv[0]).name, *sys.orig_argv[1:]]),
            "versions": {d: _version(d) for d in CLIENT_DISTS},
        },
        "profile": profile_dict(profile),
        "cells": cell_rows,
        "schedule": [dataclasses.asdict(s) for s in sessions],
        "sessions": {},
    }
    write_json(layout.manifest, manifest)
    return manifest


def declared_env(profile: Profile) -> set[str]:
    """Environment names allowed to differ between arms: per-arm settings the profile declares,
    and in mode level the scratch tree on PYTHONPATH (the patch set is what differs)."""
    declared = {k for env in profile.server.variant_env.values() for k in env}
    if profile.server.mode == "level":
        declared.add("PYTHONPATH")
    return declared


def _derive(manifest: dict[str, Any], profile: Profile) -> None:
    sessions = manifest.get("sessions") or {}
    variants: dict[str, Any] = {}
    for key in sorted(sessions, key=int):
        s = {k: v for k, v in sessions[key].items() if k != "earlier"}
        variants.setdefault(s["variant"], s | {"label": profile.labels.get(s["variant"])})
    manifest["variants"] = variants
    manifest["parity"] = certificate(sessions, declared_env(profile))


def recorded_sessions(layout: RunLayout) -> dict[str, Any]:
    return dict(read_json(layout.manifest).get("sessions") or {}) if layout.manifest.exists() else {}


def record_session(
    layout: RunLayout, index: int, entry: dict[str, Any], profile: Profile, started: float
) -> dict[str, Any]:
    """Write one session's provenance into manifest.json now (atomic replace), with the parity
    certificate re-derived, so an interrupted run keeps what its finished runs were measured on.
    A re-run of a session (resume) keeps the earlier server starts under `earlier`: their
    finished runs stay in the results and stay in the certificate."""
    manifest = read_json(layout.manifest)
    sessions = manifest.setdefault("sessions", {})
    old = sessions.get(str(index))
    earlier = list((old or {}).get("earlier", []))
    if old and old.get("started_at") != started:  # another server start of this session
        earlier.append({k: v for k, v in old.items() if k != "earlier"})
    sessions[str(index)] = entry | ({"earlier": earlier} if earlier else {})
    _derive(manifest, profile)
    write_json(layout.manifest, manifest)
    return sessions


def finalize_manifest(layout: RunLayout, profile: Profile) -> dict[str, Any]:
    """Re-derive variants and parity from the recorded sessions and stamp the end time."""
    manifest = read_json(layout.manifest)
    _derive(manifest, profile)
    manifest["ended_at"] = time.time()
    write_json(layout.manifest, manifest)
    return manifest
