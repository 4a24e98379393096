"""Per-session provenance (version, config hash, KV capacity, GPUs, image).

Everything here is read from the server (/version, /server_info in dev mode, /metrics
`cache_config_info`, the startup log) or the host (`nvidia-smi`, `docker image inspect`) and goes
into manifest.json, where the parity certificate compares the two arms.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from typing import Any

import aiohttp

from deepinfer_harness.prometheus import parse_metrics
from deepinfer_harness.run.client import get_json, get_text
from deepinfer_harness.run.server import ServerHandle

ENV_PREFIXES = ("VLLM_", "CUDA_", "NCCL_", "TORCH_", "TRITON_", "PYTORCH_")
GPU_FIELDS = (
    "name,driver_version,vbios_version,persistence_mode,ecc.mode.current,mig.mode.current,"
    "clocks.sm,clocks.applications.graphics,power.limit,temperature.gpu,"
    "clocks_throttle_reasons.active"
)
VOLATILE_CONFIG = {"instance_id"}  # random per start; everything else in vllm_config must match
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # repr() of an object /server_info could not serialize


def scrub(value: Any) -> Any:
    """vllm_config as /server_info dumps it, minus what differs on every start of the same server:
    `instance_id`, and object addresses in the repr() strings its JSON fallback writes."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if k not in VOLATILE_CONFIG}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if isinstance(value, str):
        return _ADDRESS.sub(" at 0x…", value)
    return value


def field_hashes(config: dict[str, Any]) -> dict[str, str]:
    """sha256[:12] per `section.field` (two levels), so a differing config hash names its fields."""
    out = {}
    for section, body in sorted(config.items()):
        items = body.items() if isinstance(body, dict) else [("", body)]
        for key, value in items:
            blob = json.dumps(value, sort_keys=True, default=str).encode()
            out[f"{section}.{key}".rstrip(".")] = hashlib.sha256(blob).hexdigest()[:12]
    return out


PIP_KEEP = ("vllm", "torch", "triton", "nvidia-nccl", "flashinfer", "tilelang", "deepinfer")


def gpu_facts() -> list[dict[str, str]]:
    """One dict per GPU from nvidia-smi, or [] where there is none (field names [unverified])."""
    if not shutil.which("nvidia-smi"):
        return []
    res = subprocess.run(
        ["nvidia-smi", f"--query-gpu={GPU_FIELDS}", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    keys = GPU_FIELDS.split(",")
    return [
        dict(zip(keys, (v.strip() for v in line.split(",")), strict=False))
        for line in res.stdout.splitlines()
        if line.strip()
    ]


def image_facts(image: str) -> dict[str, Any]:
    if not shutil.which("docker"):
        return {}
    res = subprocess.run(["docker", "image", "inspect", image], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        return {}
    info = json.loads(res.stdout)[0]
    labels = (info.get("Config") or {}).get("Labels") or {}
    return {
        "image_digest": (info.get("RepoDigests") or [info.get("Id")])[0],
        "image_labels": labels,
        "patches": labels.get("ai.deepinfer.patches"),
        "patches_sha256": labels.get("ai.deepinfer.patches-sha256"),
        "image_revision": labels.get("org.opencontainers.image.revision"),
    }


async def collect_variant(http: aiohttp.ClientSession, handle: ServerHandle, model: str) -> dict[str, Any]:
    base = handle.base_url
    facts: dict[str, Any] = {"served_model": model, **handle.log_facts()}
    try:
        facts["vllm_version"] = (await get_json(http, f"{base}/version")).get("version")
    except (aiohttp.ClientError, OSError):
        facts["vllm_version"] = None
    try:
        info = await get_json(http, f"{base}/server_info?config_format=json")
        config = scrub(info.get("vllm_config") or {})
        facts["server_info_sha256"] = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
        facts["server_info_fields"] = field_hashes(config)
        env = info.get("system_env") or {}
        facts["nvidia_driver_version"] = env.get("nvidia_driver_version")
        pip = str(env.get("pip_packages") or "")
        facts["pip_packages"] = [ln for ln in pip.splitlines() if ln.lower().startswith(PIP_KEEP)]
        facts["server_env"] = {
            k: v for k, v in sorted((info.get("vllm_env") or {}).items()) if k.startswith(ENV_PREFIXES)
        }
    except (aiohttp.ClientError, OSError, ValueError):
        facts["server_info_sha256"] = None  # dev mode off: recorded as unknown
    try:
        snap = parse_metrics(await get_text(http, f"{base}/metrics"))
        facts["cache_config_info"] = snap.info.get("vllm:cache_config_info", {})
    except (aiohttp.ClientError, OSError):
        facts["cache_config_info"] = {}
    facts["gpus"] = gpu_facts()
    if handle.launch.image:
        facts |= image_facts(handle.launch.image)
    return facts
