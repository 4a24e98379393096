"""One operator per module: PyTorch reference, then Triton kernel(s), then launcher."""
