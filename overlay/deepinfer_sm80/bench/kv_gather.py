"""dequantize_and_gather_k_cache on the GPU: bitwise vs upstream vLLM 0.32.0's Triton path, then base /
DeepInfer / upstream timed from 4K to 1M tokens (128-token compressed pages). Needs sm_89+ for upstream."""

from __future__ import annotations

from pathlib import Path

from deepinfer_sm80.bench import _kv_cache
from deepinfer_sm80.testing.bench import Ceilings, Target, at_least

# issue goal: >= 80 % of copy bandwidth from 48K tokens up
PCT_OF_COPY_GOAL = 80.0
GOAL_FROM_TOKENS = 49_152
# scripts/h200_final.sh runs this bench in its phase 1 (quick mode fits the short lease; no TileLang)
H200_FINAL_PHASE = 1


def targets(rows: list[dict[str, object]]) -> list[Target]:
    out = []
    for r in rows:
        if r["impl"] == "deepinfer" and int(r["size"]) >= GOAL_FROM_TOKENS:  # type: ignore[call-overload]
            out.append(
                at_least(
                    f"gather {int(r['size']) // 1024}K % of copy",  # type: ignore[call-overload]
                    float(r["pct_of_copy"] or 0.0),  # type: ignore[arg-type]
                    PCT_OF_COPY_GOAL,
                    "% of copy",
                    cause="decode arithmetic and the grid's last partial wave (see gather_mix_probe)",
                )
            )
    return out


def main(out_dir: Path, ceilings: Ceilings) -> dict[str, object]:
    result = _kv_cache.run("gather", ceilings)
    rows = [r.as_dict() for r in _kv_cache.rows("gather", result, f"bs{_kv_cache.GATHER_BLOCK_SIZE}")]
    sizes = tuple(int(r["size"]) for r in rows if int(r["size"]) >= GOAL_FROM_TOKENS)  # type: ignore[call-overload]
    found = targets(rows) + _kv_cache.same_size_targets("gather", result, PCT_OF_COPY_GOAL, sizes)
    return {"rows": rows, "targets": [t.as_dict() for t in found], **result}
