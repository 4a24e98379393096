"""KV capacity on SM8x: vLLM 0.32.0's own spec code, run for the SM8x layer's settings, sizes every cache
for the 584-byte V4 record (576-byte page alignment), and the per-request block count the engine's
"KV cache size: N tokens" line divides by is the one the record implies.

Runs upstream's `get_kv_cache_spec` methods of DeepseekV4Attention / DeepseekV4SWACache on an object
carrying what the SM8x layer's __init__ computes (the layer itself needs a GPU to build), with the
capability of an SM80 (not family 100) so the V4.1 MXFP8 record is off.
"""

from __future__ import annotations

import math
import types
from unittest import mock

import pytest

pytest.importorskip("vllm")

from vllm.models.deepseek_v41 import attention as a41
from vllm.platforms import current_platform
from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache

RECORD, ALIGN = 584, 576  # the V4 record and its page alignment (docs/FP8_DS_MLA.md)
COMPRESSED_BLOCK, SWA_BLOCK, WINDOW = 128, 32, 128


def _sm80():
    return mock.patch.object(current_platform, "is_device_capability_family", lambda family: family == 80)


def _config(max_model_len: int):
    return types.SimpleNamespace(
        cache_config=types.SimpleNamespace(block_size=COMPRESSED_BLOCK, cache_dtype="fp8_ds_mla"),
        model_config=types.SimpleNamespace(max_model_len=max_model_len),
        scheduler_config=types.SimpleNamespace(max_num_batched_tokens=8192),
        parallel_config=types.SimpleNamespace(
            decode_context_parallel_size=1, prefill_context_parallel_size=1
        ),
        max_in_flight_tokens=None,
    )


def _layer(ratio: int):
    with _sm80():
        mxfp8 = a41._use_v41_mxfp8_kv_record()
    assert mxfp8 is False  # SM80/SM86 keep the V4 record
    swa_bytes = 528 if mxfp8 else RECORD  # as DeepseekV4Attention.__init__ computes them
    return types.SimpleNamespace(
        is_kv_source=True,
        kv_cache_dtype="fp8_ds_mla",
        head_dim=512,
        kv_cache_torch_dtype=None,
        compress_ratio=ratio,
        compressed_bytes_per_token=swa_bytes,
        kv_page_alignment=512 if mxfp8 else ALIGN,
    )


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


@pytest.mark.parametrize("ratio", (1, 2))
def test_compressed_cache_page_is_the_584_byte_record(ratio: int) -> None:
    spec = a41.DeepseekV4Attention.get_kv_cache_spec(_layer(ratio), _config(4096))
    states = COMPRESSED_BLOCK // ratio
    assert spec.state_content_size_bytes == RECORD
    assert spec.page_size_bytes == _round_up(states * RECORD, ALIGN) == {1: 74880, 2: 37440}[ratio]


def test_swa_cache_page_is_the_584_byte_record() -> None:
    cache = types.SimpleNamespace(
        cache_config=types.SimpleNamespace(cache_dtype="fp8_ds_mla"),
        bounded_replay=False,
        block_size=SWA_BLOCK,
        head_dim=512,
        dtype=__import__("torch").uint8,
        window_size=WINDOW,
        packed_bytes_per_token=RECORD,
        packed_page_alignment=ALIGN,
    )
    spec = DeepseekV4SWACache.get_kv_cache_spec(cache, _config(4096))
    assert spec.page_size_bytes == _round_up(SWA_BLOCK * RECORD, ALIGN) == 19008


@pytest.mark.parametrize("max_model_len", (4096, 65536, 1 << 20))
@pytest.mark.parametrize("ratio", (1, 2))
def test_engine_blocks_per_request_follow_the_record(ratio: int, max_model_len: int) -> None:
    """What get_max_concurrency_for_kv_cache_config divides the pool by, for one compressed layer."""
    cfg = _config(max_model_len)
    spec = a41.DeepseekV4Attention.get_kv_cache_spec(_layer(ratio), cfg)
    used = spec.max_memory_usage_bytes(cfg)
    blocks = math.ceil(used / spec.page_size_bytes)
    # a request of max_model_len tokens writes max_model_len / ratio states, 128 / ratio per page
    assert blocks == math.ceil(max_model_len / COMPRESSED_BLOCK)
