"""Parity certificate: what must be identical between arms before any ratio is reported.

Allowed to differ: patch hashes, image digest/labels, wheel build id, and per-arm settings the
profile declares in `server.variant_env` (e.g. CPU core binding of two concurrent smoke
servers). Anything else that differs makes the comparison `x not comparable`.
"""

from __future__ import annotations

from typing import Any

ALLOWED = {
    "image_digest",
    "image_labels",
    "patches",
    "patches_sha256",
    "vllm_commit_id",
    "started_at",
    "base_url",
    "argv",
    "env",
    "kv_cache",
    "cache_config_info",
    "gpus",
    "non_default_args",
    "server_env",
}
COMPARED = (
    "vllm_version",
    "served_model",
    "serve_args",
    "server_info_sha256",
    "attention_backend",
    "speculative_config",
    "pip_packages",
    "engine_version",
    "model_fingerprint",
)
NETWORK_FLAGS = {"--port", "--host"}


def normalize_args(args: list[str]) -> list[str]:
    """Without where the server listens, the model positional (`--model X` and `X` serve the same:
    a run recorded before the harness moved to `vllm serve MODEL` compares equal)."""
    args = list(args)
    if "--model" in args[:-1]:
        at = args.index("--model")
        args = [args[at + 1], *args[:at], *args[at + 2 :]]
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in NETWORK_FLAGS:
            skip = True
            continue
        out.append(arg)
    return out


def _env_diff(a: dict[str, str], b: dict[str, str], declared: set[str]) -> list[str]:
    keys = (set(a) | set(b)) - declared
    return [f"env {k}: {a.get(k)!r} != {b.get(k)!r}" for k in sorted(keys) if a.get(k) != b.get(k)]


def certificate(sessions: dict[str, dict[str, Any]], declared_env: set[str]) -> dict[str, Any]:
    """Compare the first session of A with every other server start (A's later ones and the
    earlier starts of resumed sessions included)."""
    ordered = []
    for k in sorted(sessions, key=int):
        ordered += [*sessions[k].get("earlier", []), {x: v for x, v in sessions[k].items() if x != "earlier"}]
    ref = next((s for s in ordered if s.get("variant") == "A"), None)
    if ref is None:
        return {"status": "incomplete", "diffs": ["no A session recorded"], "declared": sorted(declared_env)}
    diffs: list[str] = []
    for s in ordered:
        tag = f"{s['variant']}.r{s['rep']}"
        for key in COMPARED:
            va, vb = ref.get(key), s.get(key)
            if key == "serve_args":
                va, vb = normalize_args(va or []), normalize_args(vb or [])
            if va != vb and key == "server_info_sha256":
                fa, fb = ref.get("server_info_fields") or {}, s.get("server_info_fields") or {}
                fields = sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))
                where = (
                    f" (fields {', '.join(fields[:6])}{' …' if len(fields) > 6 else ''})" if fields else ""
                )
                diffs.append(f"{tag}: server_info_sha256 {va!r} != {vb!r}{where}")
            elif va != vb:
                diffs.append(f"{tag}: {key} {va!r} != {vb!r}")
        diffs += [f"{tag}: {d}" for d in _env_diff(ref.get("env") or {}, s.get("env") or {}, declared_env)]
        ref_gpus = [(g.get("name"), g.get("driver_version")) for g in ref.get("gpus") or []]
        gpus = [(g.get("name"), g.get("driver_version")) for g in s.get("gpus") or []]
        if ref_gpus != gpus:
            diffs.append(f"{tag}: gpus {ref_gpus} != {gpus}")
    variants = {s.get("variant") for s in ordered}
    status = "ok" if not diffs and variants == {"A", "B"} else ("fail" if diffs else "incomplete")
    return {
        "status": status,
        "diffs": diffs,
        "declared": sorted(declared_env),
        "compared": list(COMPARED),
        "allowed": sorted(ALLOWED),
    }
