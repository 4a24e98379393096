"""vLLM-aware adapters (attention backend, metadata builders, gates): the only overlay code importing vllm."""
