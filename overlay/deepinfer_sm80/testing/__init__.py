"""Verification rig: compare contracts, hardware gates and budgets, cross-compilation, GPU timing."""
