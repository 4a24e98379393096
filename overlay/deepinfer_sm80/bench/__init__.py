"""GPU microbenchmarks: each module has `main(out_dir, ceilings) -> dict`; see `__main__`."""

BENCH_MODULES = (
    "deepinfer_sm80.bench.upstream_baseline",
    "deepinfer_sm80.bench.topk_swa_combine",
    "deepinfer_sm80.bench.kv_cache",
)
