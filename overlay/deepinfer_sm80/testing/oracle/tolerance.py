"""Placeholder values; derived in docs/ORACLE.md (replaced below once measured)."""

NLL_TOKEN_TOL = 0.0
NLL_MEAN_TOL = 0.0
GREEDY_MARGIN = 0.0
