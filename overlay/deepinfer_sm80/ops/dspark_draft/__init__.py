"""DSpark draft step (docs/DSPARK.md): PyTorch reference and the one-launch-per-position Triton kernel."""

from deepinfer_sm80.ops.dspark_draft.kernel import DraftScratch, draft_step
from deepinfer_sm80.ops.dspark_draft.reference import (
    combine_rank_partials,
    draft_chain_ref,
    draft_step_ref,
    noise_hash,
)

__all__ = [
    "DraftScratch",
    "combine_rank_partials",
    "draft_chain_ref",
    "draft_step",
    "draft_step_ref",
    "noise_hash",
]
