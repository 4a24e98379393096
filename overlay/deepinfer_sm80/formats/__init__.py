"""Record layouts of the caches our kernels read and write (constants and tensor views, no kernels) and
the model's shapes (`v41.py`)."""
