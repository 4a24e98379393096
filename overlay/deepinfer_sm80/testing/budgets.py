"""The SM budgets the cross-compile checks against; they live in `deepinfer_sm80.device` (re-exported)."""

from deepinfer_sm80.device import (
    BUDGETS,
    HW_FP8_ARCH,
    REPORT_BUDGETS,
    SM80,
    SM86,
    SM89,
    SmBudget,
    max_ctas_per_sm,
    over_budget,
)

__all__ = [
    "BUDGETS",
    "HW_FP8_ARCH",
    "REPORT_BUDGETS",
    "SM80",
    "SM86",
    "SM89",
    "SmBudget",
    "max_ctas_per_sm",
    "over_budget",
]
