"""Measure the oracle's numerical sensitivity on the tiny V4.1 checkpoint (docs/ORACLE.md, "calibration").

    python scripts/oracle_calibrate.py --ckpt .cache/tiny-v41 [--ckpt .cache/tiny-v41-small-topk] \
        [--prompts 6] [--tokens 48] --out results/oracle/calibration-cpu.json

For each prompt (slices of the harness corpus, tokenized with the checkpoint's tokenizer) the oracle runs
three times: as shipped, with its GEMMs accumulated by torch's fp32 GEMM instead of the bf16 one (the same
rounding points, another summation order: the kind of difference the engine has), and with no bf16
rounding of activations at all (every rounding point moved by up to half an ulp: the upper model). It
records per-token NLL differences, the change of each position's top-1 - top-2 margin, argmax flips, the
margin distribution, and what deliberate mistakes (mutations of one piece each) do to the NLL, so the
tolerances in `deepinfer_sm80.testing.oracle.tolerance` can be checked against what they must separate.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

MUTATIONS = ("no_sink", "no_fp8_kv", "no_engram", "no_inverse_rope", "all_compressed", "no_candidates")


@contextmanager
def mutation(o: object, name: str) -> Iterator[None]:
    """One deliberate mistake in the oracle, undone on exit."""
    from deepinfer_sm80.testing.oracle import attention, indexer

    saved: list[tuple[object, str, object]] = []

    def patch(obj: object, attr: str, value: object) -> None:
        saved.append((obj, attr, getattr(obj, attr)))
        setattr(obj, attr, value)

    blocks = o.blocks  # type: ignore[attr-defined]
    if name == "no_sink":
        for b in blocks:
            patch(b.attn, "sink", torch.full_like(b.attn.sink, float("-inf")))
    elif name == "no_fp8_kv":
        patch(attention, "ds_mla_read", lambda x: x)
    elif name == "no_engram":
        for b in blocks:
            patch(b, "engram", False)
    elif name == "no_inverse_rope":
        real = attention.rotate
        patch(attention, "rotate", lambda x, t, p, inverse=False: x if inverse else real(x, t, p))
    elif name == "all_compressed":
        patch(indexer, "topk_mask", lambda s, allowed, k: allowed)
    elif name == "no_candidates":
        patch(indexer, "block_mask", lambda s, visible, n, b: visible)
    else:
        raise ValueError(f"unknown mutation {name!r}")
    try:
        yield
    finally:
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)


def nll(logits: torch.Tensor, ids: list[int]) -> torch.Tensor:
    return -torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)


def margin_of(logits: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """logit[top1] - logit[top2] at each position, for the given (top1, top2) ids [T, 2]."""
    v = logits.gather(1, top)
    return v[:, 0] - v[:, 1]


def compare(base: torch.Tensor, other: torch.Tensor, ids: list[int]) -> dict[str, float]:
    top = base.topk(2, dim=-1).indices
    dn = nll(base, ids) - nll(other, ids)
    return {
        "nll_token_max": float(dn.abs().max()),
        "nll_mean_abs": float(dn.mean().abs()),
        "margin_change_max": float((margin_of(base, top) - margin_of(other, top)).abs().max()),
        "logit_change_max": float((base - other).abs().max()),
        "argmax_flips": int((base.argmax(-1) != other.argmax(-1)).sum()),
    }


def run_checkpoint(ckpt: Path, n_prompts: int, n_tokens: int, log: Callable[[str], None]) -> dict:
    from tokenizers import Tokenizer

    from deepinfer_harness.prompts import corpus_text
    from deepinfer_sm80.testing.oracle import V41Oracle, quant

    o = V41Oracle.load(ckpt)
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    text = corpus_text()
    step = max(1, (len(text) - 2000) // max(1, n_prompts))
    prompts = [tok.encode(text[i * step : i * step + 2000]).ids[:n_tokens] for i in range(n_prompts)]
    rows, margins, top1_lp = [], [], []
    for k, ids in enumerate(prompts):
        t0 = time.time()
        base = o.logits(ids)
        with quant.fp32_gemms():
            order = o.logits(ids)
        with quant.fp32_activations():
            f32 = o.logits(ids)
        top = base.topk(2, dim=-1).values
        margins.append(top[:, 0] - top[:, 1])
        top1_lp.append(torch.log_softmax(base, dim=-1).amax(dim=-1))
        row = {
            "prompt": k,
            "tokens": len(ids),
            "nll_mean": float(nll(base, ids).mean()),
            "order": compare(base, order, ids),
            "fp32": compare(base, f32, ids),
        }
        if k == 0:
            row["mutations"] = {}
            for m in MUTATIONS:
                with mutation(o, m):
                    row["mutations"][m] = compare(base, o.logits(ids), ids)
        row["seconds"] = round(time.time() - t0, 1)
        log(json.dumps(row))
        rows.append(row)
    m = torch.cat(margins)
    qs = (0.05, 0.1, 0.25, 0.5, 0.75)
    return {
        "checkpoint": str(ckpt),
        "index_topk": o.t["index_topk"],
        "candidate_topk_blocks": o.t.get("candidate_topk_blocks"),
        "prompts": rows,
        "margin_quantiles": {str(q): float(m.quantile(q)) for q in qs},
        "margins": [float(x) for x in m],
        "top1_logprob_mean": float(torch.cat(top1_lp).mean()),
    }


def summarize(runs: list[dict]) -> dict:
    """Per checkpoint: the worst order / fp32-mode changes, the mutations' effects, and targets that hold
    the tolerances (chosen by `tolerance.tolerances` for the run's prompts) against them."""
    from deepinfer_sm80.testing.bench import at_least, at_most
    from deepinfer_sm80.testing.oracle import tolerance as tol

    out: dict = {"per_checkpoint": [], "targets": []}
    for run in runs:
        rows = run["prompts"]
        t = {"compress_ratios": [1], "num_hidden_layers": 1, "index_topk": run["index_topk"]}
        tl = tol.tolerances(t, max(r["tokens"] for r in rows))
        keys = ("nll_token_max", "nll_mean_abs", "margin_change_max", "logit_change_max", "argmax_flips")
        worst = {mode: {k: max(r[mode][k] for r in rows) for k in keys} for mode in ("order", "fp32")}
        mut = {m: r["mutations"][m]["nll_mean_abs"] for r in rows if "mutations" in r for m in r["mutations"]}
        margins = torch.tensor(run["margins"])
        above = float((margins > tl["greedy_margin"]).float().mean())
        tag = f"index_topk {run['index_topk']}"
        tg = [
            at_most(f"{tag}: order-mode per-token NLL change / tolerance", worst["order"]["nll_token_max"]
                    / tl["nll_token"], 0.5, "ratio", "like-for-like noise above half the tolerance"),
            at_most(f"{tag}: order-mode mean NLL change / tolerance", worst["order"]["nll_mean_abs"]
                    / tl["nll_mean"], 0.5, "ratio", "like-for-like noise above half the tolerance"),
            at_most(f"{tag}: order-mode margin change / greedy margin", worst["order"]["margin_change_max"]
                    / tl["greedy_margin"], 0.5, "ratio", "like-for-like noise above half the margin"),
            at_least(f"{tag}: positions with margin above the greedy margin", above, 0.5, "fraction",
                     "fewer than half the greedy steps comparable"),
        ]  # fmt: skip
        for m, v in mut.items():
            if v == 0.0:  # the mutated piece does not run at this prompt length (no selection)
                continue
            tg.append(at_least(f"{tag}: mutation {m}: mean NLL change / tolerance", v / tl["nll_mean"], 1.0,
                               "ratio", "the mean tolerance misses this mistake"))  # fmt: skip
        out["per_checkpoint"].append({"checkpoint": run["checkpoint"], "index_topk": run["index_topk"],
                                      "tolerances": tl, "worst": worst, "mutations_nll_mean_abs": mut,
                                      "fraction_margin_above_greedy_margin": above,
                                      "margin_quantiles": run["margin_quantiles"]})  # fmt: skip
        out["targets"] += [x.as_dict() for x in tg]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", action="append", default=[], help="a tiny V4.1 checkpoint directory")
    ap.add_argument("--resummarize", help="recompute the summary and targets of an earlier output's runs")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.resummarize:
        prev = json.loads(Path(args.resummarize).read_text())
        out = {"provenance": prev["provenance"], "runs": prev["runs"], **summarize(prev["runs"])}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        print(json.dumps(out["targets"], indent=1))
        return 0
    if not args.ckpt:
        print("error: give --ckpt (or --resummarize)", file=sys.stderr)
        return 2
    for c in args.ckpt:
        if not (Path(c) / "config.json").is_file():
            print(f"error: {c}: no config.json (build it with scripts/make_tiny_v41.py)", file=sys.stderr)
            return 2
    from deepinfer_sm80.testing.provenance import provenance

    runs = [
        run_checkpoint(Path(c), args.prompts, args.tokens, lambda s: print(s, flush=True)) for c in args.ckpt
    ]
    out = {"provenance": provenance(), "runs": runs, **summarize(runs)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(
        json.dumps(
            {k: out[k] for k in ("worst", "mutation_nll_mean_abs_min", "fraction_margin_above_threshold")}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
