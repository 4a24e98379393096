"""The oracle's pieces against hand-checkable cases (formats, mHC, RoPE, attention, indexer, MoE, Engram)."""

from __future__ import annotations

import torch

from deepinfer_sm80.testing.inputs import generator, seed_note
from deepinfer_sm80.testing.oracle import engram, indexer, mhc, moe, quant, rope
from deepinfer_sm80.testing.oracle.attention import ds_mla_read, sparse_attention

U8 = torch.uint8


# ----------------------------------------------------------------------------- formats
def test_e4m3_decode_known_bytes_and_all_codes() -> None:
    b = torch.tensor([0x00, 0x01, 0x08, 0x38, 0xB8, 0x7E, 0xFE], dtype=U8)
    assert quant.e4m3_decode(b).tolist() == [0.0, 2.0**-9, 2.0**-6, 1.0, -1.0, 448.0, -448.0]
    codes = torch.arange(256, dtype=torch.int32).to(U8)
    ours = quant.e4m3_decode(codes)
    nan = (codes & 0x7F) == 0x7F
    assert torch.isnan(ours[nan]).all() and int(nan.sum()) == 2
    assert torch.equal(ours[~nan], codes.view(torch.float8_e4m3fn).float()[~nan])
    # the loader's fast path (torch's conversion to bf16) decodes every finite code the same way
    assert torch.equal(quant.e4m3_values(codes)[~nan].float(), ours[~nan])


def test_e4m3_encode_rounds_to_nearest_even_and_saturates() -> None:
    codes = torch.arange(256, dtype=torch.int32).to(U8)
    v = quant.e4m3_decode(codes)
    finite = ~torch.isnan(v)
    assert torch.equal(quant.e4m3_encode(v[finite]), v[finite])  # every e4m3 value is a fixed point
    # 1 + 1/16 lies halfway between 1 and 1.125: the even mantissa wins; 1.1875 -> 1.25 likewise;
    # above 448 saturates; 2^-10 is half the subnormal step (-> 0), 3 * 2^-10 is 1.5 steps (-> 2 steps)
    x = torch.tensor([1.0625, 1.1875, 460.0, 1e6, 2.0**-10, 3 * 2.0**-10])
    assert quant.e4m3_encode(x).tolist() == [1.0, 1.25, 448.0, 448.0, 0.0, 2.0**-8]
    name = "oracle-e4m3-encode"
    y = (torch.randn(4096, generator=generator(name)) * 50).clamp(-448, 448)
    assert torch.equal(quant.e4m3_encode(y), y.to(torch.float8_e4m3fn).float()), seed_note(name)


def test_ue8m0_and_block_dequant_of_known_bytes() -> None:
    assert quant.ue8m0(torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=U8)).tolist() == [
        0.0, 2.0**-126, 0.5, 1.0, 2.0, 2.0**127, float("inf")
    ]  # fmt: skip
    codes = torch.full((32, 64), 0x38, dtype=U8)  # 1.0 everywhere
    codes[0, 0], codes[31, 63] = 0xC0, 0x7E  # -2.0 and 448
    w = quant.fp8_block_dequant(codes.view(torch.float8_e4m3fn), torch.tensor([[127, 129]], dtype=U8))
    assert w.dtype == torch.bfloat16 and w[0, 0] == -2.0 and w[5, 5] == 1.0 and w[5, 40] == 4.0
    assert w[31, 63] == 448.0 * 4


def test_mxfp4_nibble_order_sign_and_scale() -> None:
    # byte 0x21: low nibble 1 (0.5) is column 0, high nibble 2 (1.0) column 1; 0x9A: 0xA = -1.0, 0x9 = -0.5
    packed = torch.tensor([[0x21, 0x9A] + [0x77] * 14], dtype=U8).view(torch.int8)
    w = quant.mxfp4_dequant(packed, torch.tensor([[128]], dtype=U8))  # x 2
    assert w[0, :4].tolist() == [1.0, 2.0, -2.0, -1.0] and w[0, 4:].unique().tolist() == [12.0]


def test_pow2_quant_scale_and_exact_groups() -> None:
    x = torch.zeros(2, 128)
    x[0, :64] = torch.linspace(-448 * 8, 448 * 8, 64).round()  # amax 3584 = 448 * 2^3: scale 2^3
    out = quant.pow2_quant(x, 64)
    assert torch.equal(out[1], torch.zeros(128))  # all-zero groups stay zero (amax floored at 1e-4)
    assert torch.equal(out[0, :64], quant.e4m3_encode(x[0, :64] / 8) * 8)
    assert out[0, 63] == 3584.0 and out[0, 0] == -3584.0


def test_ds_mla_record_keeps_rope_dims_and_quantizes_nope() -> None:
    g = generator("oracle-ds-mla")
    lat = quant.bf16(torch.randn(8, 512, generator=g))
    got = ds_mla_read(lat)
    assert torch.equal(got[:, 448:], lat[:, 448:])  # the 64 RoPE values are bf16 in the record
    rel = (got[:, :448] - lat[:, :448]).abs() / lat[:, :448].abs().reshape(8, 7, 64).amax(
        -1
    ).repeat_interleave(64, 1)
    assert rel.max() <= 2.0**-4, seed_note("oracle-ds-mla")  # half an e4m3 step of the group's top binade
    assert not torch.equal(got[:, :448], lat[:, :448])


# ----------------------------------------------------------------------------- mHC
def _cfg() -> dict:
    return {"hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-20}


def test_sinkhorn_is_doubly_stochastic() -> None:
    name = "oracle-sinkhorn"
    c = mhc.sinkhorn(torch.randn(64, 4, 4, generator=generator(name)), 20, 1e-6)
    assert (c > 0).all()
    assert (c.sum(-2) - 1).abs().max() < 4e-6, seed_note(name)  # columns: the last step normalises them
    assert (c.sum(-1) - 1).abs().max() < 1e-4, seed_note(name)  # rows: 20 rounds of Sinkhorn


def test_boundary_pieces_hand_cases() -> None:
    name = "oracle-mhc-boundary"
    g = generator(name)
    h = 64
    r = quant.bf16(torch.randn(3, 4, h, generator=g))
    x = quant.bf16(torch.randn(3, h, generator=g))
    eye = torch.eye(4).expand(3, 4, 4)
    assert torch.equal(mhc.post_map(x, r, torch.zeros(3, 4), eye), r)  # identity comb, no post
    one = mhc.post_map(x, torch.zeros_like(r), torch.ones(3, 4), eye)
    assert torch.equal(one, x[:, None, :].expand(-1, 4, -1))
    onehot = torch.zeros(3, 4)
    onehot[:, 2] = 1
    assert torch.equal(mhc.collapse(r, onehot), r[:, 2])
    p = mhc.HcParams(
        torch.randn(24, 4 * h, generator=g) * 0.1, torch.tensor([1.0, 1.0, 1.0]), torch.zeros(24)
    )
    rr, post, comb, y, pre = mhc.first_boundary(x, p, _cfg())
    assert torch.equal(y, x) and torch.equal(
        rr[:, 3], x
    )  # the model's entry selects stream 0 = the embedding
    assert ((post > 0) & (post < 2)).all() and (pre > 1e-6).all() and (pre < 1 + 1e-6 + 1e-7).all()
    # the broadcast projection equals projecting the 4 equal streams (same mixes up to rounding)
    _, comb2, _, pre2 = mhc.boundary(rr, p, None, _cfg())
    assert torch.allclose(pre, pre2, atol=1e-5) and torch.allclose(comb, comb2, atol=1e-5), seed_note(name)


# ----------------------------------------------------------------------------- RoPE
def test_rope_identity_at_zero_inverse_and_plain_table() -> None:
    scaling = {"factor": 16, "original_max_position_embeddings": 4, "beta_fast": 32, "beta_slow": 1}
    t = {"rope_theta": 10000, "max_position_embeddings": 64, "compress_rope_theta": 160000}
    t["rope_scaling"] = scaling
    plain, yarn = rope.cos_sin_table(t, False), rope.cos_sin_table(t, True)
    assert plain.shape == (64, 64) and yarn.shape == (64, 64)
    i = torch.arange(32, dtype=torch.float32)
    assert torch.allclose(plain[5, :32], torch.cos(5 * 10000 ** (-2 * i / 64)), atol=1e-6)
    name = "oracle-rope"
    x = torch.randn(6, 3, 128, generator=generator(name))
    pos = torch.tensor([0, 1, 2, 7, 30, 63])
    y = rope.rotate(x, yarn, pos)
    assert torch.equal(y[0], x[0]) and torch.equal(y[:, :, :64], x[:, :, :64])  # position 0; NoPE dims
    assert torch.allclose(rope.rotate(y, yarn, pos, inverse=True), x, atol=1e-5), seed_note(name)
    assert torch.allclose(y[..., 64:].norm(dim=-1), x[..., 64:].norm(dim=-1), atol=1e-4)


# ----------------------------------------------------------------------------- attention / indexer
def test_attention_sink_and_full_topk() -> None:
    name = "oracle-attention"
    g = generator(name)
    q, k = torch.randn(5, 3, 16, generator=g), torch.randn(9, 16, generator=g)
    allowed = torch.ones(5, 9, dtype=torch.bool)
    no_sink = sparse_attention(q, k, allowed, torch.full((3,), float("-inf")), 0.25)
    ref = torch.softmax(torch.einsum("thd,nd->thn", q, k) * 0.25, dim=-1) @ k
    assert torch.allclose(no_sink, ref, atol=1e-6), seed_note(name)
    # a sink is one more logit whose value row is zero
    sink = torch.tensor([0.5, -1.0, 2.0])
    s = torch.einsum("thd,nd->thn", q, k) * 0.25
    p = torch.softmax(torch.cat([s, sink[None, :, None].expand(5, 3, 1)], dim=-1), dim=-1)[..., :9]
    assert torch.allclose(sparse_attention(q, k, allowed, sink, 0.25), p @ k, atol=1e-6)
    # a top-k that covers every allowed state selects them all, so restricted = full attention
    sc = torch.randn(5, 9, generator=g)
    assert torch.equal(indexer.topk_mask(sc, allowed, 9), allowed)
    assert torch.equal(indexer.topk_mask(sc, allowed, 12), allowed)
    picked = indexer.topk_mask(sc, allowed, 3)
    assert (picked.sum(1) == 3).all() and torch.equal(picked, sc >= sc.topk(3).values[:, -1:])


def test_candidate_blocks_pin_the_newest_block() -> None:
    s = torch.tensor([[9.0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, -5]])  # 17 states, blocks of 4
    vis = torch.ones_like(s, dtype=torch.bool)
    m = indexer.block_mask(s, vis, 2, 4)
    # block 0 (max 9) and the newest state's block 4 (pinned) are kept, block 1 (max 2) is not
    assert m[0].nonzero().flatten().tolist() == [0, 1, 2, 3, 16]
    vis[0, 9:] = False  # a token that sees 9 states: its newest is in block 2
    assert indexer.block_mask(s, vis, 2, 4)[0].nonzero().flatten().tolist() == [0, 1, 2, 3, 8]


def test_indexer_q_quant_folds_a_power_of_two() -> None:
    name = "oracle-indexer-q"
    q = quant.bf16(torch.randn(4, 32, 128, generator=generator(name)) * 3)
    q8, s = indexer.quantize_q(q)
    assert torch.equal(torch.exp2(torch.log2(s).round()), s)  # a power of two per (token, head)
    assert (q8.abs().amax(-1) <= 448).all() and torch.equal(quant.e4m3_encode(q8), q8)
    assert ((q8 * s[..., None] - q).abs() <= q.abs().amax(-1, keepdim=True) * 2.0**-4).all(), seed_note(name)


# ----------------------------------------------------------------------------- MoE
def test_router_bias_steers_choice_not_weights() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    w, ids = moe.route(logits, torch.zeros(4), 2, 1.5)
    assert ids.tolist() == [[0, 1]]
    sp = torch.sqrt(torch.nn.functional.softplus(logits[0, :2]))
    assert torch.allclose(w[0], sp / sp.sum() * 1.5)
    w2, ids2 = moe.route(logits, torch.tensor([0.0, 0.0, 5.0, 0.0]), 2, 1.5)  # the bias pulls expert 2 in
    assert sorted(ids2[0].tolist()) == [0, 2]
    sp2 = torch.sqrt(torch.nn.functional.softplus(logits[0, ids2[0]]))
    assert torch.allclose(w2[0], sp2 / sp2.sum() * 1.5) and abs(float(w2.sum()) - 1.5) < 1e-6


# ----------------------------------------------------------------------------- Engram
def _layout() -> engram.EngramLayout:
    t = {"engram_layer_ids": [1, 2], "engram_max_ngram_size": 3, "engram_n_heads": 2, "engram_vocab_size": 50,
         "engram_compressed_vocab_size": 20, "engram_pad_token_id": 0}  # fmt: skip
    return engram.EngramLayout.from_config(t, [i % 20 for i in range(30)])


def test_engram_hashes_by_hand() -> None:
    lay = _layout()
    assert lay.primes.tolist() == [[53, 59, 61, 67], [71, 73, 79, 83]]  # successive primes above 49
    assert lay.offsets.tolist() == [[0, 53, 112, 173], [0, 71, 144, 223]]
    ids = torch.tensor([3, 7, 11, 5, 9])
    got = lay.hashes(ids)
    for li in range(2):
        mult = [int(m) for m in lay.mult[li]]
        for p in range(5):
            rolling, blocked = 0, False
            for s in range(3):
                blocked |= p - s < 0
                v = lay.pad_id if blocked else int(ids[p - s])
                rolling ^= v * mult[s]
                if s:
                    for h in range(2):
                        c = (s - 1) * 2 + h
                        assert got[p, li, c] == rolling % int(lay.primes[li, c]) + int(lay.offsets[li, c])
    # an n-gram of at most 3 tokens: position 4 does not see position 1
    other = ids.clone()
    other[1] = 12
    assert torch.equal(lay.hashes(other)[4], got[4]) and not torch.equal(lay.hashes(other)[3], got[3])


def test_engram_inject_gates_a_value() -> None:
    name = "oracle-engram-inject"
    g = generator(name)
    r = quant.bf16(torch.randn(3, 4, 32, generator=g))
    kv = quant.bf16(torch.randn(3, 5 * 32, generator=g))
    ones = torch.ones(4, 32)
    zero_value = kv.clone()
    zero_value[:, 4 * 32 :] = 0
    assert torch.equal(
        engram.engram_inject(r, zero_value, ones, ones, 1e-20), r
    )  # no value: streams unchanged
    out = engram.engram_inject(r, kv, ones, ones, 1e-20)
    gate = (out - r)[..., 0] / kv[:, None, 4 * 32]
    assert ((gate > 0) & (gate < 1)).all(), seed_note(name)
