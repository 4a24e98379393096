"""Equality contracts: bitwise (first mismatch with both byte patterns) or tolerance in dtype eps.

Both check NaN and ±inf positions first, so a kernel can never pass by producing NaN where the
reference has a number or the reverse.
"""

from __future__ import annotations

import torch

BF16_EPS = torch.finfo(torch.bfloat16).eps  # 2^-7
FP16_EPS = torch.finfo(torch.float16).eps  # 2^-10
FP32_EPS = torch.finfo(torch.float32).eps  # 2^-23

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class MismatchError(AssertionError):
    pass


def _index(flat_pos: int, shape: torch.Size) -> tuple[int, ...]:
    idx = []
    for dim in reversed(shape):
        idx.append(flat_pos % dim)
        flat_pos //= dim
    return tuple(reversed(idx))


def _hex(value: torch.Tensor) -> str:
    raw = value.reshape(1).contiguous().view(torch.uint8).tolist()
    return "0x" + "".join(f"{b:02x}" for b in reversed(raw))  # little-endian -> MSB first


def _check_meta(name: str, out: torch.Tensor, ref: torch.Tensor) -> None:
    if out.shape != ref.shape:
        raise MismatchError(f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    if out.dtype != ref.dtype:
        raise MismatchError(f"{name}: dtype {out.dtype} != reference {ref.dtype}")


def _check_special_positions(name: str, out: torch.Tensor, ref: torch.Tensor) -> None:
    if not out.dtype.is_floating_point:
        return
    o, r = out.float(), ref.float()
    for what, om, rm in (
        ("NaN", o.isnan(), r.isnan()),
        ("+inf", o == float("inf"), r == float("inf")),
        ("-inf", o == float("-inf"), r == float("-inf")),
    ):
        bad = (om != rm).flatten().nonzero()
        if bad.numel():
            pos = int(bad[0])
            at = _index(pos, out.shape)
            raise MismatchError(
                f"{name}: {what} positions differ at {at} ({bad.numel()} elements): "
                f"out={o.flatten()[pos].item()!r} ref={r.flatten()[pos].item()!r}"
            )


def assert_bitwise_equal(name: str, out: torch.Tensor, ref: torch.Tensor) -> None:
    """Every element's bytes equal; NaN positions must match (NaN payloads are not compared)."""
    _check_meta(name, out, ref)
    _check_special_positions(name, out, ref)
    o, r = out.detach().cpu().contiguous(), ref.detach().cpu().contiguous()
    view = _INT_VIEW[o.element_size()]
    ob, rb = o.view(view).flatten(), r.view(view).flatten()
    differ = ob != rb
    if o.dtype.is_floating_point:
        differ &= ~o.flatten().isnan()
    bad = differ.nonzero()
    if bad.numel():
        pos = int(bad[0])
        raise MismatchError(
            f"{name}: {bad.numel()} of {ob.numel()} elements differ; first at {_index(pos, o.shape)}: "
            f"out={o.flatten()[pos].item()!r} ({_hex(o.flatten()[pos])}) "
            f"ref={r.flatten()[pos].item()!r} ({_hex(r.flatten()[pos])})"
        )


def assert_close(
    name: str, out: torch.Tensor, ref: torch.Tensor, *, abs: float, rel_in_eps: float, why: str
) -> None:
    """|out - ref| <= abs + rel_in_eps * eps(out.dtype) * |ref| elementwise, after special positions match.

    `why` records the reason for the tolerance (accumulation order, approximate exp, ...).
    """
    if not why:
        raise ValueError(f"{name}: a tolerance needs its reason")
    _check_meta(name, out, ref)
    _check_special_positions(name, out, ref)
    eps = torch.finfo(out.dtype).eps
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    finite = r.isfinite()
    err = (o - r).abs().where(finite, torch.zeros_like(o))
    bound = abs + rel_in_eps * eps * r.abs().where(finite, torch.zeros_like(r))
    bad = (err > bound).flatten().nonzero()
    if bad.numel():
        pos = int(bad[0])
        raise MismatchError(
            f"{name}: {bad.numel()} elements outside abs={abs} + {rel_in_eps}·eps·|ref| ({why}); "
            f"first at {_index(pos, o.shape)}: out={o.flatten()[pos].item()!r} "
            f"ref={r.flatten()[pos].item()!r}, max err {err.max().item():.3e}"
        )


def _ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 bit patterns as int32 in value order: consecutive representable values differ by 1."""
    bits = t.contiguous().view(torch.int16).to(torch.int32)
    return torch.where(bits < 0, -(bits & 0x7FFF), bits)


def assert_within_ulps(
    name: str, out: torch.Tensor, ref: torch.Tensor, *, ulps: int, abs: float, why: str
) -> None:
    """16-bit floats: each element at most `ulps` representable values from ref's, or |out - ref| <= abs.

    The distance is counted on the bit patterns (value-ordered), so "one ulp" means the neighbouring
    representable value on either side, also across a power of two and through zero.
    """
    if not why:
        raise ValueError(f"{name}: a tolerance needs its reason")
    if out.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"{name}: ulp distance is defined here for bf16/fp16, not {out.dtype}")
    _check_meta(name, out, ref)
    _check_special_positions(name, out, ref)
    o, r = out.detach().cpu(), ref.detach().cpu()
    steps = (_ordered_bits(o) - _ordered_bits(r)).abs().flatten()
    err = (o.double() - r.double()).abs().flatten()
    finite = r.flatten().isfinite()
    bad = (finite & (steps > ulps) & (err > abs)).nonzero()
    if bad.numel():
        pos = int(bad[0])
        raise MismatchError(
            f"{name}: {bad.numel()} elements more than {ulps} ulp and abs={abs} from ref ({why}); "
            f"first at {_index(pos, o.shape)}: out={o.flatten()[pos].item()!r} "
            f"ref={r.flatten()[pos].item()!r}, {int(steps[pos])} ulp"
        )


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 values at |x| (fp32): 2^(e - 8) for x = m·2^e, m in [0.5, 1); 2^-133 at 0."""
    _, e = torch.frexp(x.float())
    ulp = torch.ldexp(torch.ones_like(x, dtype=torch.float32), e - 8)
    return torch.where(x == 0, torch.full_like(ulp, 2.0**-133), ulp)


def assert_within_bound(
    name: str, out: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor, *, why: str
) -> None:
    """|out - ref| <= bound elementwise (a per-element error bound argued in `why`), specials matching."""
    if not why:
        raise ValueError(f"{name}: a tolerance needs its reason")
    if out.shape != ref.shape or bound.shape != ref.shape:
        raise MismatchError(f"{name}: shapes {tuple(out.shape)} / {tuple(ref.shape)} / {tuple(bound.shape)}")
    _check_special_positions(name, out.float(), ref.float())
    o, r, b = out.detach().double().cpu(), ref.detach().double().cpu(), bound.detach().double().cpu()
    finite = r.isfinite()
    err = (o - r).abs().where(finite, torch.zeros_like(o))
    bad = (err > b).flatten().nonzero()
    if bad.numel():
        pos = int(bad[0])
        raise MismatchError(
            f"{name}: {bad.numel()} elements outside their bound ({why}); first at {_index(pos, o.shape)}: "
            f"out={o.flatten()[pos].item()!r} ref={r.flatten()[pos].item()!r} "
            f"bound={b.flatten()[pos].item():.3e}"
        )
