"""SM80 ports of upstream vLLM 0.32.0 `cache_utils.py` functions that cannot run on sm_80/86 (patch 00).

Same names and signatures as upstream. `combine_topk_swa_indices` is absent on purpose: upstream's own
Triton kernel compiles and runs on sm_80/86 unchanged, so it is the SM80 baseline and patch 00 leaves it.
"""
