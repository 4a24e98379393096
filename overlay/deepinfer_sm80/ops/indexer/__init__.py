"""The lightning indexer on SM80/SM86 (docs/INDEXER.md): fp8 Q/K writers, MQA logits, candidates, top-k.

Modules by role: `q_quant` (RoPE + e4m3 Q, folded weights), `k_store` (k_norm + RoPE + e4m3 K record),
`logits` (dense prefill and paged decode logits, the base level), `select` (candidate blocks and the
top-k references), `stream` (the optimized level: chunked logits with a running top-k).
"""
