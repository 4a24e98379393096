"""Host memory for DeepSeek-V4.1's Engram tables, checked before the engine starts (issue 22 item 6).

vLLM 0.32.0's `EngramConfig.cpu_offload` defaults to True (config/engram.py): every Engram table is
allocated in pinned host memory (`torch.empty(..., pin_memory=True)`, or huge pages registered with
`cudaHostRegister` under `use_thp`) and read by the GPU through UVA (common/engram.py
ParallelEngramEmbedding). A replica's TP ranks hold disjoint head shards, so one replica pins the whole
table set: `sum(engram_num_embeddings) * (engram_head_dim + engram_head_dim / 32)` bytes (e4m3 rows plus
one UE8M0 scale byte per 32 values; the same bound upstream's /dev/shm check uses, engram.py
can_share_engram_tables). Co-located DP replicas each pin their own copy unless `dp_shared_memory`
(one copy per node, in /dev/shm). Pinning more than the host can give fails at load time, after the
model is half built, or swaps the node; this check says so first.

What counts as available: `MemAvailable` of /proc/meminfo (what the kernel can hand out without
swapping). `RLIMIT_MEMLOCK` is reported beside it and flagged when it is finite and below the need;
whether the CUDA driver's pinning is charged to it is not something this module has measured, so a
low limit is a warning, not a refusal.

    python -m deepinfer_sm80.integration.engram_memory CONFIG_JSON_OR_DIR [--dp-per-node N] [--shared]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SCALE_BLOCK = 32  # values per UE8M0 scale byte (ParallelEngramEmbedding block_size)
MEMINFO = Path("/proc/meminfo")


class EngramMemoryError(RuntimeError):
    """The Engram tables do not fit in the host memory this node can pin."""


@dataclass(frozen=True)
class EngramMemoryCheck:
    layers: tuple[int, ...]
    table_bytes: int  # one full table set (one DP replica)
    copies: int  # table sets pinned on this node
    need_bytes: int
    available_bytes: int | None  # MemAvailable; None where /proc/meminfo is absent
    memlock_bytes: int | None  # RLIMIT_MEMLOCK soft limit; None = unlimited
    ok: bool
    message: str  # one line, for logs and the preflight

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_config(source: str | Path | Mapping[str, Any]) -> Mapping[str, Any]:
    """A checkpoint's config: a mapping, a config.json, or a directory holding one."""
    if isinstance(source, Mapping):
        return source
    path = Path(source)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"engram memory: no config.json at {path}")
    cfg = json.loads(path.read_text())
    return cfg.get("text_config", cfg) if "engram_layer_ids" not in cfg else cfg


def engram_table_bytes(config: Mapping[str, Any]) -> int:
    """Bytes of one full set of Engram tables (0 for a model without Engram layers)."""
    layers = config.get("engram_layer_ids") or []
    if not layers:
        return 0
    sizes = config.get("engram_num_embeddings")
    dim = config.get("engram_head_dim")
    if not isinstance(sizes, list) or len(sizes) != len(layers) or not isinstance(dim, int) or dim <= 0:
        raise ValueError(
            "engram memory: the config needs engram_num_embeddings (one per engram_layer_ids entry) and a "
            f"positive engram_head_dim; got {sizes!r} and {dim!r}"
        )
    if dim % SCALE_BLOCK:
        raise ValueError(f"engram memory: engram_head_dim {dim} is not a multiple of {SCALE_BLOCK}")
    return sum(int(n) for n in sizes) * (dim + dim // SCALE_BLOCK)


def mem_available(meminfo: Path = MEMINFO) -> int | None:
    """MemAvailable in bytes, or None where the file (or the field) is absent."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def memlock_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_engram_host_memory(
    config: str | Path | Mapping[str, Any],
    *,
    dp_per_node: int = 1,
    cpu_offload: bool = True,
    dp_shared_memory: bool = False,
    meminfo: Path = MEMINFO,
    memlock: int | str | None = "read",
) -> EngramMemoryCheck:
    """Pinned host bytes the Engram tables need on this node against what it can give.

    dp_per_node: DP replicas on this node (each pins its own copy unless dp_shared_memory).
    cpu_offload=False: the tables live in GPU memory (counted by vLLM's own profiling), need 0 here.
    """
    if dp_per_node < 1:
        raise ValueError(f"engram memory: dp_per_node must be >= 1, got {dp_per_node}")
    cfg = load_config(config)
    layers = tuple(int(x) for x in (cfg.get("engram_layer_ids") or []))
    table = engram_table_bytes(cfg)
    copies = 0 if not cpu_offload or table == 0 else (1 if dp_shared_memory else dp_per_node)
    need = table * copies
    avail = mem_available(meminfo)
    lock = memlock_limit() if memlock == "read" else memlock
    assert lock is None or isinstance(lock, int)
    if need == 0:
        why = "no Engram layers" if table == 0 else "cpu_offload off: the tables are in GPU memory"
        return EngramMemoryCheck(layers, table, copies, 0, avail, lock, True, f"Engram host memory: {why}")
    head = (
        f"Engram tables (layers {list(layers)}): {copies} x {_gib(table)} = {_gib(need)} pinned host memory"
    )
    if avail is None:
        return EngramMemoryCheck(
            layers, table, copies, need, None, lock, False, f"{head}; MemAvailable unknown ({meminfo})"
        )
    ok = need <= avail
    msg = f"{head}, {_gib(avail)} available (MemAvailable)"
    if not ok:
        msg += (
            "; does not fit: free host memory, use fewer DP replicas per node, set "
            "--engram-config '{\"dp_shared_memory\": true}' (one copy per node in /dev/shm), or "
            "'{\"cpu_offload\": false}' (tables in GPU memory)"
        )
    if lock is not None and lock < need:
        msg += f"; note RLIMIT_MEMLOCK {_gib(lock)} is below the need (ulimit -l)"
    return EngramMemoryCheck(layers, table, copies, need, avail, lock, ok, msg)


def preflight_engram_memory(config: str | Path | Mapping[str, Any], **kwargs: Any) -> EngramMemoryCheck:
    """The harness's preflight: the check, raising EngramMemoryError (its one-line message) if short."""
    result = check_engram_host_memory(config, **kwargs)
    if not result.ok:
        raise EngramMemoryError(result.message)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", help="the checkpoint's config.json, or its directory")
    ap.add_argument("--dp-per-node", type=int, default=1, help="DP replicas on this node (default 1)")
    ap.add_argument("--shared", action="store_true", help="dp_shared_memory: one copy per node")
    ap.add_argument("--no-offload", action="store_true", help="cpu_offload off (tables in GPU memory)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        result = check_engram_host_memory(
            args.config,
            dp_per_node=args.dp_per_node,
            dp_shared_memory=args.shared,
            cpu_offload=not args.no_offload,
        )
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result.as_dict()) if args.json else result.message)
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
