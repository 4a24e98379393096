"""`make report`: the result tables and figures of README.md, docs/*.md, docker/README.md, harness/README.md.

A document owns prose; the renderer owns marked regions:

    <!-- report:KIND key=value ... -->
    (rendered text; block regions start and end on their own lines, inline ones sit in a sentence)
    <!-- /report:KIND -->

KIND picks a renderer below (RENDERERS), the key=value arguments say which results file and which rows.
`file=` paths are relative to results/. Running it twice changes nothing; `--check` changes nothing
and exits 1 naming each region whose text differs from what the JSON gives (tests/test_report.py).
A marker naming an unknown kind, a missing file or a row the file does not have fails in one line.

Usage: python scripts/report.py [--check] [--root DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", "docs/*.md", "docker/README.md", "harness/README.md")
REGION = re.compile(
    r"<!-- report:(?P<kind>[\w-]+)(?P<args>[^>]*?) -->(?P<body>.*?)<!-- /report:(?P=kind) -->", re.S
)
IMPL_ORDER = ("deepinfer", "base", "upstream", "torch")
SYMBOL = {">=": "≥", "<=": "≤", "==": "="}
NAME = {"deepinfer": "DeepInfer", "base": "base", "upstream": "upstream", "torch": "torch"}


class ReportError(Exception):
    """A marker the renderer cannot honour: its message is the one line the user sees."""


# ----------------------------------------------------------------------------- formatting
def num(x: float | int | None, digits: int | None = None) -> str:
    """µs and GB/s as the tables print them: 1 decimal from 10, 2 below, thousands separated."""
    if x is None:
        return "–"
    if isinstance(x, int) and digits is None:
        return f"{x:,}"
    if digits is None:
        if x and abs(x) < 0.01:
            return f"{x:.2e}"  # a relative error or a tiny share: its exponent is the information
        digits = 1 if abs(x) >= 10 else 2
    return f"{x:,.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    """a / b as `1.23×`; – where either is missing."""
    return f"{a / b:.2f}×" if a and b else "–"


def size_label(n: int) -> str:
    """Token / key counts as the benches name them: 4096 -> 4K, 1048576 -> 1M."""
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10}K"
    return str(n)


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- inputs
class Results:
    def __init__(self, root: Path) -> None:
        self.dir = root / "results"
        self._cache: dict[str, object] = {}

    def path(self, rel: str) -> Path:
        path = self.dir / rel
        if not path.is_file():
            raise ReportError(f"results/{rel}: no such file")
        return path

    def json(self, rel: str) -> dict:
        if rel not in self._cache:
            self._cache[rel] = json.loads(self.path(rel).read_text())
        return self._cache[rel]  # type: ignore[return-value]


def _list(args: dict[str, str], key: str) -> list[str]:
    return [v for v in args.get(key, "").split(",") if v]


def _need(args: dict[str, str], key: str) -> str:
    if key not in args:
        raise ReportError(f"argument {key}= missing")
    return args[key]


def _rows(res: Results, args: dict[str, str]) -> list[dict]:
    rel, op = _need(args, "file"), _need(args, "op")
    rows = [r for r in res.json(rel).get("rows", []) if r["op"] == op]
    if not rows:
        raise ReportError(f"results/{rel}: no rows of op {op!r}")
    return rows


# ----------------------------------------------------------------------------- renderers
def render_rows(res: Results, args: dict[str, str]) -> str:
    """One line per (shape, size): each impl's µs, DeepInfer's % of copy and × floor, speed-ups."""
    rows = _rows(res, args)
    shapes = _list(args, "shapes") or sorted({r["shape"] for r in rows})
    sizes = [int(s) for s in _list(args, "sizes")]
    impls = [i for i in IMPL_ORDER if any(r["impl"] == i for r in rows)]
    by = {(r["shape"], r["size"], r["impl"]): r for r in rows}
    header = ["shape", args.get("size_name", "size")]
    header += [f"{NAME[i]} µs" for i in impls] + ["DeepInfer % of copy", "DeepInfer × floor"]
    header += [f"× {i}" for i in impls if i != "deepinfer"]
    out = []
    for shape in shapes:
        present = sorted({s for (sh, s, _) in by if sh == shape})
        if not present:
            raise ReportError(f"results/{args['file']}: no rows of shape {shape!r}")
        for size in [s for s in present if not sizes or s in sizes]:
            cell = {i: by.get((shape, size, i)) for i in impls}
            ours = cell.get("deepinfer")
            us = {i: (c["us"] if c else None) for i, c in cell.items()}
            line = [shape, size_label(size)] + [num(us[i]) for i in impls]
            line.append(num(ours["pct_of_copy"], 0) if ours and ours.get("pct_of_copy") is not None else "–")
            line.append(ratio(ours["us"], ours["floor_us"]) if ours and ours.get("floor_us") else "–")
            line += [ratio(us[i], us.get("deepinfer")) for i in impls if i != "deepinfer"]
            out.append(line)
    if sizes and len(out) < len(sizes) * len(shapes):
        raise ReportError(f"results/{args['file']}: sizes {sizes} not all present for {shapes}")
    return table(header, out)


def render_grid(res: Results, args: dict[str, str]) -> str:
    """Shapes down, sizes across, each cell `impl1 / impl2 / …` µs (the order in `impls=`)."""
    rows = _rows(res, args)
    impls = _list(args, "impls") or ["base", "deepinfer", "upstream"]
    by = {(r["shape"], r["size"], r["impl"]): r["us"] for r in rows}
    shapes = _list(args, "shapes") or sorted({r["shape"] for r in rows})
    sizes = [int(s) for s in _list(args, "sizes")] or sorted({r["size"] for r in rows})
    header = [args.get("corner", "shape")] + [size_label(s) for s in sizes]
    out = []
    for shape in shapes:
        cells = []
        for size in sizes:
            vals = [by.get((shape, size, i)) for i in impls]
            if all(v is None for v in vals):
                raise ReportError(f"results/{args['file']}: no {shape} rows at size {size}")
            cells.append(" / ".join(num(v) for v in vals))
        out.append([shape, *cells])
    return table(header, out)


def _measured(value: object) -> str:
    if isinstance(value, float):
        return num(value, 3 if abs(value) < 10 else None)
    if isinstance(value, int):
        return num(value)
    return "not measured" if value is None else str(value)


def render_targets(res: Results, args: dict[str, str]) -> str:
    """Every target of the listed files: measured, the goal with its direction, met, the cause."""
    out = []
    grep = args.get("match", "")
    for rel in _list(args, "files") or [_need(args, "file")]:
        targets = res.json(rel).get("targets") or []
        if not targets:
            raise ReportError(f"results/{rel}: no targets")
        for t in targets:
            if grep and grep not in t["name"]:
                continue
            shown = _measured(t["measured"])
            goal = f"{SYMBOL[t['direction']]} {t['goal']} {t['unit']}".strip()
            out.append([t["name"], f"{shown} {t['unit']}".strip(), goal, "met" if t["met"] else "**missed**",
                        t.get("cause") or ""])  # fmt: skip
    if not out:
        raise ReportError(f"no target matches {grep!r}")
    return table(["target", "measured", "goal", "met", "cause (as the JSON records it)"], out)


def render_setup(res: Results, args: dict[str, str]) -> str:
    """The hardware, versions, dates and copy ceilings of the listed GPU results files."""
    docs = [res.json(rel) for rel in _need(args, "files").split(",")]
    provs = [d["provenance"] for d in docs]
    ceilings = [d["ceilings"] for d in docs if "ceilings" in d] + [
        d["environment"]["ceilings"] for d in docs if "ceilings" in d.get("environment", {})
    ]

    def values(key: str) -> str:
        return ", ".join(sorted({str(p[key]) for p in provs if p.get(key)}))

    copy = [c["copy_gbps"] / 1e3 for c in ceilings]
    launch = [c["empty_launch_us"] for c in ceilings]
    dates = sorted({str(p["date"])[:10] for p in provs})
    return (
        f"Hardware: {values('hardware')}, driver {values('driver')}; torch {values('torch')}, "
        f"triton {values('triton')}; run on {', '.join(dates)}. Copy ceiling (best of three "
        f"device-to-device copies, bytes read + written) {min(copy):.2f}–{max(copy):.2f} TB/s and empty "
        f"launch {min(launch):.2f}–{max(launch):.2f} µs over these {len(docs)} files."
    )


def _cases(res: Results, args: dict[str, str]) -> list[ET.Element]:
    """The testcases of a JUnit XML, those whose `classname::name` contains `match=` when given."""
    root = ET.parse(res.path(_need(args, "file"))).getroot()
    if root.tag != "testsuite" and root.find("testsuite") is None:
        raise ReportError(f"results/{args['file']}: no testsuite element")
    cases = list(root.iter("testcase"))
    if "match" in args:
        cases = [c for c in cases if args["match"] in f"{c.get('classname', '')}::{c.get('name', '')}"]
        if not cases:
            raise ReportError(f"results/{args['file']}: no testcase matching {args['match']!r}")
    return cases


def _failure(case: ET.Element) -> ET.Element | None:
    failure = case.find("failure")
    return failure if failure is not None else case.find("error")


def render_junit(res: Results, args: dict[str, str]) -> str:
    """`N passed, M failed, K skipped of T` from a pytest JUnit XML (its cases matching `match=`)."""
    cases = _cases(res, args)
    failed = sum(_failure(c) is not None for c in cases)
    skipped = sum(c.find("skipped") is not None and _failure(c) is None for c in cases)
    total = len(cases)
    return f"{total - failed - skipped} passed, {failed} failed, {skipped} skipped of {total}"


def _message(failure: ET.Element) -> str:
    message = (failure.get("message") or "").replace("deepinfer_sm80.testing.compare.MismatchError: ", "")
    message = re.sub(r" case '[^']*' seed \d+ \(crc32 of the name\)", "", message.split("; first at")[0])
    lines = message.strip().splitlines() or [""]
    first = lines[0].strip() + (" …" if len(lines) > 1 else "")  # a traceback: its first line, one table row
    return first.replace("|", "\\|")


def render_junit_failures(res: Results, args: dict[str, str]) -> str:
    """One line per failed test of a JUnit XML (matching `match=`): its id and the failure message up
    to its coordinates."""
    out = []
    for case in _cases(res, args):
        failure = _failure(case)
        if failure is not None:
            out.append([f"`{case.get('name')}`", _message(failure)])
    if not out:
        return "No failures."
    return table(["test", "failure (the XML's message, up to its first coordinate)"], sorted(out))


def render_junit_new_failures(res: Results, args: dict[str, str]) -> str:
    """`N more fail (X to Y elements)`: the tests of `file=` that fail and did not fail in `base=`,
    with the span of the element counts their messages give (`<n> elements ...`)."""
    failed = {c.get("name"): f for c in _cases(res, args) if (f := _failure(c)) is not None}
    base = {c.get("name") for c in _cases(res, {"file": _need(args, "base")}) if _failure(c) is not None}
    new = [f for name, f in failed.items() if name not in base]
    counts = [int(m.group(1)) for f in new if (m := re.search(r"(\d+) elements", f.get("message") or ""))]
    text = f"{len(new)} more fail"
    if counts:
        text += f" ({min(counts)} to {max(counts)} elements)"
    return text


def render_compile_count(res: Results, args: dict[str, str]) -> str:
    """`N kernels (`prefix*`) compile for sm_80, sm_86 and sm_89, S spill bytes, H on hardware e4m3` from
    sm80-compile.json: every kernel whose name starts with `prefix=`, counted once over its archs."""
    doc = res.json(_need(args, "file"))
    prefix = _need(args, "prefix")
    rows = [k for k in doc.get("kernels", []) if isinstance(k, dict) and k.get("name", "").startswith(prefix)]
    if not rows:
        raise ReportError(f"results/{args['file']}: no kernel named {prefix}*")
    names = {k["name"] for k in rows}
    archs = sorted({int(k["arch"]) for k in rows})
    incomplete = sorted(n for n in names if {int(k["arch"]) for k in rows if k["name"] == n} != set(archs))
    if incomplete:
        raise ReportError(f"results/{args['file']}: {incomplete} not compiled for every arch {archs}")
    spills = sum(int(k.get("spill_bytes") or 0) for k in rows)
    hw_fp8 = len({k["name"] for k in rows if k.get("uses_hw_fp8")})
    arch_text = ", ".join(f"sm_{a}" for a in archs[:-1]) + " and " * (len(archs) > 1) + f"sm_{archs[-1]}"
    return (f"{len(names)} kernels (`{prefix}*`) compile for {arch_text}: {spills} spill bytes in all, "
            f"{hw_fp8} using hardware e4m3")  # fmt: skip


def _at(node: object, path: str, rel: str) -> object:
    for key in path.split("."):
        if isinstance(node, list) and key.isdigit():
            node = node[int(key)]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            raise ReportError(f"results/{rel}: no {path!r}")
    return node


def render_series(res: Results, args: dict[str, str]) -> str:
    """`v1 unit (label1), v2 unit (label2), …` from a JSON list of objects (`path=`): each object's
    `field=` (dotted), labelled by its `by=` (token counts as the benches name them: 4K, 1M)."""
    rel = _need(args, "file")
    items = _at(res.json(rel), _need(args, "path"), rel)
    if not isinstance(items, list) or not items:
        raise ReportError(f"results/{rel}: {args['path']!r} is not a non-empty list")
    unit = f" {args['unit']}" if args.get("unit") else ""
    digits = int(args["digits"]) if "digits" in args else None
    out = []
    for item in items:
        value, label = _at(item, _need(args, "field"), rel), _at(item, _need(args, "by"), rel)
        shown = num(value, digits) if isinstance(value, float) else str(value)
        out.append(f"{shown}{unit} ({size_label(label) if isinstance(label, int) else label})")
    return ", ".join(out)


def render_span(res: Results, args: dict[str, str]) -> str:
    """`lo–hi unit over N` of one field (`field=`, dotted) over a JSON list of objects (`path=`)."""
    rel = _need(args, "file")
    items = _at(res.json(rel), _need(args, "path"), rel)
    if not isinstance(items, list):
        raise ReportError(f"results/{rel}: {args['path']!r} is not a list")
    values = []
    for item in items:
        try:
            value = _at(item, _need(args, "field"), rel)
        except ReportError:
            continue
        if isinstance(value, int | float):
            values.append(float(value))
    if not values:
        raise ReportError(f"results/{rel}: no {args['field']!r} in {args['path']!r}")
    digits = int(args.get("digits", 1))
    unit = f" {args['unit']}" if args.get("unit") else ""
    over = f"over {len(values)} {args.get('of', 'values')}"
    return f"{min(values):.{digits}f}–{max(values):.{digits}f}{unit} {over}"


def render_progress(res: Results, args: dict[str, str]) -> str:
    """Outcomes in a quiet pytest log's progress lines (`..F.s [ 16%]`), counted."""
    text = res.path(_need(args, "file")).read_text()
    marks = "".join(m.group(1) for m in re.finditer(r"^([.FsExX]+)\s*(?:\[\s*\d+%\])?\s*$", text, re.M))
    if not marks:
        raise ReportError(f"results/{args['file']}: no pytest progress lines")
    return (f"{len(marks)} results logged ({marks.count('.')} passed, {marks.count('F')} failed, "
            f"{marks.count('s')} skipped)")  # fmt: skip


def render_sanitize(res: Results, args: dict[str, str]) -> str:
    """compute-sanitizer's error summary and pytest's pass count from a sanitizer log."""
    text = res.path(_need(args, "file")).read_text()
    errors = re.findall(r"ERROR SUMMARY: (\d+) error", text)
    passed = re.findall(r"(\d+) passed", text)
    if not errors or not passed:
        raise ReportError(f"results/{args['file']}: no ERROR SUMMARY / passed line")
    return f"{errors[-1]} errors over {passed[-1]} tests"


def render_value(res: Results, args: dict[str, str]) -> str:
    """One value of a JSON by path (`results.decode_64K_r1.logits_us`), formatted like the tables;
    `scale=` divides it first (bytes as GB, seconds as minutes), `digits=` and `unit=` as given."""
    node: object = res.json(_need(args, "file"))
    for key in _need(args, "path").split("."):
        if isinstance(node, list):
            node = node[int(key)]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            raise ReportError(f"results/{args['file']}: no {args['path']!r}")
    unit = f" {args['unit']}" if args.get("unit") else ""
    if "scale" in args and isinstance(node, int | float):  # e.g. scale=1e9 for bytes shown in GB
        node = node / float(args["scale"])
    if isinstance(node, float):
        return num(node, int(args["digits"]) if "digits" in args else None) + unit
    return f"{node}{unit}"


def render_image_smoke(res: Results, args: dict[str, str]) -> str:
    """Per-stage seconds, image sizes and digests of `make image-smoke` runs (results/image-smoke*.json)."""
    rels = sorted(p.relative_to(res.dir).as_posix() for p in res.dir.glob("image-smoke*.json"))
    if not rels:
        return "No `make image-smoke` result is committed (no `results/image-smoke*.json`): no figures."
    out = []
    for rel in rels:
        doc = res.json(rel)
        for stage in doc["stages"]:
            steps = f"{stage['steps_run']} / {stage['steps_cached']}" if "steps_run" in stage else "–"
            seconds = num(float(stage["seconds"]), 0)
            out.append([rel, doc["cache"], stage["name"], seconds, steps, stage["status"]])
    lines = [table(["run", "cache", "stage or phase", "seconds", "steps run / cached", "status"], out), ""]
    images = []
    for rel in rels:
        for img in res.json(rel).get("images", []):
            images.append([rel, img["tag"], f"{img['size_bytes'] / 1e9:.2f} GB", f"`{img['id'][:19]}`"])
    if images:
        lines.append(table(["run", "image", "size", "image id"], images))
    return "\n".join(lines).rstrip()


def render_compile(res: Results, args: dict[str, str]) -> str:
    """Cross-compile resources (sm80-compile.json or sm80-reachability.json) of kernels named `match`."""
    doc = res.json(_need(args, "file"))
    match = _need(args, "match")
    items = doc.get("kernels") if isinstance(doc.get("kernels"), list) and doc["kernels"] and isinstance(
        doc["kernels"][0], dict) else doc.get("rows", [])  # fmt: skip
    seen, out = set(), []
    for k in items:
        name = k.get("name") or k.get("kernel", "")
        key = (name, k["arch"], k.get("regs"), k.get("spill_bytes"), k.get("smem_bytes"))
        if match not in name or key in seen:
            continue
        seen.add(key)
        ctas = k.get("max_ctas_per_sm")
        out.append([f"`{name.rsplit('.', 1)[-1] if 'kernel' in k else name}`", f"sm_{k['arch']}",
                    str(k.get("regs")), str(k.get("spill_bytes", 0)), num(k.get("smem_bytes")),
                    "–" if ctas is None else str(ctas)])  # fmt: skip
    if not out:
        raise ReportError(f"results/{args['file']}: no kernel matching {match!r}")
    return table(["kernel", "arch", "regs", "spill B", "smem B", "CTAs/SM"], out)


def render_mapping(res: Results, args: dict[str, str]) -> str:
    """A JSON object (by `path=`) as a two-column table, values formatted like the tables."""
    node: object = res.json(_need(args, "file"))
    for key in _need(args, "path").split("."):
        if not isinstance(node, dict) or key not in node:
            raise ReportError(f"results/{args['file']}: no {args['path']!r}")
        node = node[key]
    if not isinstance(node, dict):
        raise ReportError(f"results/{args['file']}: {args['path']!r} is not an object")
    cells = [[str(k), num(v) if isinstance(v, (int, float)) else str(v)] for k, v in node.items()]
    return table([args.get("key", "case"), args.get("value", "value")], cells)


def render_records(res: Results, args: dict[str, str]) -> str:
    """Objects of a JSON object (by `path=`, keys starting with `prefix=`) as a table: a row per key,
    `columns=` inner keys (– where a record lacks one)."""
    node: object = res.json(_need(args, "file"))
    for key in _need(args, "path").split("."):
        if not isinstance(node, dict) or key not in node:
            raise ReportError(f"results/{args['file']}: no {args['path']!r}")
        node = node[key]
    columns = _list(args, "columns")
    if not isinstance(node, dict) or not columns:
        raise ReportError(f"results/{args['file']}: {args['path']!r}: no object of objects, or no columns=")
    prefix = args.get("prefix", "")
    out = []
    for name, rec in node.items():
        if not name.startswith(prefix) or not isinstance(rec, dict):
            continue
        if not any(c in rec for c in columns):
            raise ReportError(f"results/{args['file']}: {args['path']}.{name} has none of {columns}")
        cells = [num(v) if isinstance(v := rec.get(c), int | float) else str(v or "–") for c in columns]
        out.append([str(name).removeprefix(prefix), *cells])
    if not out:
        raise ReportError(f"results/{args['file']}: no {args['path']}.{prefix}* records")
    return table([args.get("key", "case"), *columns], out)


def render_ab_pairs(res: Results, args: dict[str, str]) -> str:
    """`N–M pairs per cell, fewer than the K a CI needs` from a bench-ab run's ab.json."""
    doc = res.json(_need(args, "file"))
    pairs = sorted({int(r["n_pairs"]) for r in doc.get("rows", []) if r.get("n_pairs") is not None})
    if not pairs:
        raise ReportError(f"results/{args['file']}: no rows with n_pairs")
    span = str(pairs[0]) if pairs[0] == pairs[-1] else f"{pairs[0]}–{pairs[-1]}"
    need = doc.get("min_pairs")
    below = all(p < need for p in pairs) if isinstance(need, int) else False
    return f"{span} pairs per cell" + (f", below the {need} a CI needs" if below else "")


def _secs(wall: float | None, cpu: float | None) -> str:
    return "–" if wall is None else f"{wall:.0f} / {cpu:.0f} s" if cpu is not None else f"{wall:.0f} s"


def render_e2e_cases(res: Results, args: dict[str, str]) -> str:
    """`make e2e-cpu`'s JSON: a row per engine, level, case and prompt: engine start and case times
    (wall / CPU), the tokens, the oracle's agreement, the NLL shift (engine - oracle, mean ± SE, z)
    and the per-token spread of the engine against the oracle's own order- and fp32-mode noise."""
    doc = res.json(_need(args, "file"))
    out = []
    for eng in doc.get("engines", []):
        for level, lv in eng.get("levels", {}).items():
            start = lv.get("start", {})
            for i, case in enumerate(lv.get("cases", [])):
                for j, (p, o) in enumerate(zip(case["prompts"], case.get("oracle", []), strict=False)):
                    first = i == 0 and j == 0
                    same = o["generated"] == o["oracle_top1"]
                    agree = (
                        "same"
                        if same
                        else f"{o['greedy_mismatches']} of {o['greedy_compared']} above margin differ"
                    )
                    sd = o.get("noise_sd", {})
                    shift = (
                        "–"
                        if o.get("nll_shift") is None
                        else f"{o['nll_shift']:+.3f} ± {o['nll_shift_se']:.3f} (z {o['nll_shift_z']:+.1f})"
                    )
                    spread = " / ".join(
                        "–" if sd.get(k) is None else f"{sd[k]:.2f}" for k in ("engine", "order", "fp32")
                    )
                    out.append(
                        [
                            f"{eng['name']} / {level}" if first else "",
                            _secs(start.get("wall_s"), start.get("cpu_s")) if first else "",
                            f"{case['name']} ({o['prompt_tokens']})",
                            _secs(case.get("wall_s"), case.get("cpu_s")),
                            " ".join(map(str, p["tokens"])),
                            f"{agree} ({', '.join(f'{m:.2f}' for m in o['oracle_margins'])})",
                            shift,
                            spread,
                            num(o.get("max_token_logprob_abs_diff")),
                        ]
                    )
    if not out:
        raise ReportError(f"results/{args['file']}: no engine cases with an oracle comparison")
    header = [
        "engine / level",
        "start (wall / CPU)",
        "case (prompt tokens)",
        "case (wall / CPU)",
        "tokens",
        "oracle top-1 (margins)",
        "NLL shift, nats/token",
        "per-token SD: engine / order / fp32",
        "max token Δ",
    ]
    return table(header, out)


def render_e2e_engines(res: Results, args: dict[str, str]) -> str:
    """An e2e JSON, one row per engine and level: its pipeline partition and scheduler, the greedy tokens
    of each case (prompts separated by `/`), DSpark's accepted / drafted tokens, its targets met (every
    target named after the engine and level, plus its base-vs-optimized ones) and its wall time."""
    doc = res.json(_need(args, "file"))
    targets = doc.get("targets", [])
    out = []
    for eng in doc.get("engines", []):
        name = eng["name"]
        for level, lv in eng.get("levels", {}).items():
            mine = [t for t in targets if t["name"].startswith(f"{name}/{level}/")]
            cases = "; ".join(
                f"{c['name']}: " + " / ".join(" ".join(map(str, p["tokens"])) for p in c["prompts"])
                for c in lv.get("cases", [])
            )
            spec = lv.get("spec_decode") or {}
            acc = spec.get("vllm:spec_decode_num_accepted_tokens")
            dr = spec.get("vllm:spec_decode_num_draft_tokens")
            drafts = "–" if dr is None or acc is None else f"{acc:.0f} / {dr:.0f}"
            out.append(
                [
                    f"`{name}` / {level}",
                    eng.get("env", {}).get("VLLM_PP_LAYER_PARTITION", "one stage"),
                    str(lv.get("scheduler") or "–"),
                    cases if lv.get("ok") else f"failed: {lv.get('error', '')}",
                    drafts,
                    f"{sum(t['met'] for t in mine)} of {len(mine)}",
                    f"{lv['wall_s']:.0f} s",
                ]
            )
    if not out:
        raise ReportError(f"results/{args['file']}: no engines")
    header = ["engine / level", "partition", "scheduler", "greedy tokens per case", "accepted / drafted",
              "targets met", "wall"]  # fmt: skip
    return table(header, out)


def render_e2e_engine_met(res: Results, args: dict[str, str]) -> str:
    """`M of N targets met` of one engine at one level of an e2e JSON (`engine=`, `level=`)."""
    doc = res.json(_need(args, "file"))
    prefix = f"{_need(args, 'engine')}/{_need(args, 'level')}/"
    mine = [t for t in doc.get("targets", []) if t["name"].startswith(prefix)]
    if not mine:
        raise ReportError(f"results/{args['file']}: no target of {prefix}")
    return f"{sum(bool(t['met']) for t in mine)} of {len(mine)} targets met"


def render_e2e_summary(res: Results, args: dict[str, str]) -> str:
    """`N targets: M met, K open (names), F failed; wall W s` of an e2e JSON."""
    doc = res.json(_need(args, "file"))
    targets = doc.get("targets", [])
    if not targets:
        raise ReportError(f"results/{args['file']}: no targets")
    met = sum(t["met"] for t in targets)
    opened = [t["name"] for t in targets if not t["met"] and "open" in t]
    failed = [t["name"] for t in targets if not t["met"] and "open" not in t]
    text = f"{len(targets)} targets: {met} met, {len(opened)} open, {len(failed)} failed"
    if failed:
        text += " (" + ", ".join(f"`{n}`" for n in failed) + ")"
    return text + f"; wall {doc['wall_s']:.0f} s"


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}×" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}×"


# What "upstream" is in each bench (overlay/deepinfer_sm80/bench/<op>.py): vLLM 0.32.0's own function on the
# same inputs, which is not always the kernel vLLM runs on a Hopper card (there: FlashMLA, DeepGEMM).
UPSTREAM_KERNEL = {
    "sparse_mla_decode": "`rocm_sparse_attn_decode`: vLLM's ROCm Triton path run on CUDA, not the FlashMLA "
    "vLLM serves with on sm_90",
    "sparse_mla_prefill": "`rocm_sparse_attn_prefill`: vLLM's ROCm Triton path run on CUDA, not FlashMLA",
    "kv_gather": "`dequantize_and_gather_k_cache`, vLLM's Triton path (hardware e4m3)",
    "kv_quant_insert": "`quantize_and_insert_k_cache`, vLLM's kernel (hardware e4m3)",
    "topk_swa_combine": "`combine_topk_swa_indices`, vLLM's own function",
    "indexer_decode_logits": "`_fp8_paged_mqa_logits_decode_kernel`: vLLM's ROCm Triton kernel, not the "
    "DeepGEMM vLLM uses on sm_90",
    "indexer_decode_topk": "– (no upstream top-k timed)",
    "indexer_prefill_topk": "– (no upstream top-k timed)",
    "dspark_draft": "vLLM's draft chain (eager ops) and its `gumbel_sample`",
}


def render_headline(res: Results, args: dict[str, str]) -> str:
    """One line per kernel (op) of the listed GPU JSONs: ours against upstream's kernel and against the
    base level, each the span of time ratios (their µs over ours, > 1 = ours faster) over every shape
    and size timed for both, and the file's targets met. Ours = the DeepInfer row where the op has one,
    else the base row (the op ships at the base level). `ops=` keeps those ops, each of which must exist."""
    out: list[list[str]] = []
    seen: set[str] = set()
    for rel in _list(args, "files") or [_need(args, "file")]:
        doc = res.json(rel)
        rows = [r for r in doc.get("rows", []) if isinstance(r, dict) and r.get("us")]
        if not rows:
            raise ReportError(f"results/{rel}: no timed rows")
        ops = list(dict.fromkeys(r["op"] for r in rows))
        if wanted := _list(args, "ops"):
            ops = [o for o in ops if o in wanted]
        targets = doc.get("targets") or []
        met = f"{sum(bool(t['met']) for t in targets)} of {len(targets)}" if targets else "–"
        for op in ops:
            by = {(r["shape"], r["size"], r["impl"]): r["us"] for r in rows if r["op"] == op}
            ours = "deepinfer" if any(k[2] == "deepinfer" for k in by) else "base"
            spans = []
            for other in ("upstream", "base"):
                if other == ours:
                    spans.append("–")
                    continue
                ratios = [by[(sh, sz, other)] / us for (sh, sz, impl), us in by.items()
                          if impl == ours and (sh, sz, other) in by]  # fmt: skip
                spans.append(f"{_span(ratios)} ({len(ratios)})" if ratios else "–")
            upstream = UPSTREAM_KERNEL.get(op, "–")
            out.append([f"`{op}`", NAME[ours], spans[0], upstream, spans[1], met, f"`{rel}`"])
            seen.add(op)
    if missing := [o for o in _list(args, "ops") if o not in seen]:
        raise ReportError(f"no timed rows of op(s) {missing} in {_list(args, 'files') or [args['file']]}")
    header = ["kernel", "ours", "× upstream (shapes)", "upstream is", "× base (shapes)", "file's targets met",
              "file"]  # fmt: skip
    return table(header, out)


def render_count_greater(res: Results, args: dict[str, str]) -> str:
    """`N of M`: of the objects under `path=` whose key starts with `prefix=`, how many have field `a=`
    greater than field `b=` (e.g. the streamed top-k's workspace against the dense one's, per shape)."""
    node = _at(res.json(_need(args, "file")), _need(args, "path"), args["file"])
    if not isinstance(node, dict):
        raise ReportError(f"results/{args['file']}: {args['path']} is not an object")
    a, b, prefix = _need(args, "a"), _need(args, "b"), args.get("prefix", "")
    pairs = [(v[a], v[b]) for k, v in node.items() if k.startswith(prefix) and isinstance(v, dict)
             and a in v and b in v]  # fmt: skip
    if not pairs:
        raise ReportError(f"results/{args['file']}: no {args['path']}.{prefix}* holds {a} and {b}")
    return f"{sum(x > y for x, y in pairs)} of {len(pairs)}"


def render_serve_command(res: Results, args: dict[str, str]) -> str:
    """The owner's `docker run … vllm serve …` for a deployment (scripts/serving.py), built from the
    harness profile `profile=` with the harness's own serve_args / serve_env (not from results/)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import serving

    name = _need(args, "profile")
    if name not in {d.profile for d in serving.DEPLOYMENTS}:
        raise ReportError(f"{name} is not a deployment of scripts/serving.py")
    return serving.render(name)


def render_hardware_fit(res: Results, args: dict[str, str]) -> str:
    """Per card size and stage of one deployment (`profile=`) in results/hardware-fit.json: weights per
    GPU, one max_model_len request's KV, the reserve, what is left (GiB), and vLLM's KV tokens."""
    doc = res.json(_need(args, "file"))
    name = _need(args, "profile")
    dep = next((d for d in doc.get("deployments", []) if d["profile"] == name), None)
    if dep is None:
        raise ReportError(f"results/{args['file']}: no deployment {name}")
    out = []
    for card in dep["cards"]:
        for s in card["stages"]:
            layers = f"{s['layers'][0]}-{s['layers'][1]}" + (
                f" + draft {s['draft_layers'][0]}-{s['draft_layers'][1]}" if s["draft_layers"] else ""
            )
            verdict = (
                f"fits: {card['kv_cache_size_tokens']:,} KV tokens"
                if card["fits"]
                else f"does not fit ({card['cause']})"
            )
            gib = [card["requested_gib"], s["weights_gib"], s["kv_one_request_gib"]]
            out.append([f"{card['card_gib']:g} GB", str(s["rank"]), layers, *(f"{x:.2f}" for x in gib),
                        f"{card['reserve_gib']:g}", f"{s['left_gib']:.2f}", verdict])  # fmt: skip
    header = ["card", "stage", "layers", "vLLM may use (GiB)", "weights / GPU", "KV of one 1M request",
              "reserve", "left", "the deployment"]  # fmt: skip
    return table(header, out)


def render_run_wall(res: Results, args: dict[str, str]) -> str:
    """`M.m min` from a bench-ab run's manifest.json: ended_at - started_at (epoch seconds)."""
    doc = res.json(_need(args, "file"))
    start, end = doc.get("started_at"), doc.get("ended_at")
    if not isinstance(start, int | float) or not isinstance(end, int | float) or end < start:
        raise ReportError(f"results/{args['file']}: no started_at / ended_at")
    return f"{(end - start) / 60:.1f} min"


CALIBRATION_ROWS = {
    "nll_token_max": "per-token abs NLL change",
    "nll_mean_abs": "abs change of a prompt's mean NLL",
    "margin_change_max": "change of a position's top-1 - top-2 margin",
    "logit_change_max": "any single logit",
}


def render_oracle_calibration(res: Results, args: dict[str, str]) -> str:
    """docs/ORACLE.md's calibration tables from results/oracle/calibration-cpu.json, one column per
    checkpoint (`labels=` names them, in order): `table=worst`, the worst like-for-like change per
    quantity in order and fp32 mode; `table=margins`, the quantiles of the top-1 - top-2 margin."""
    rel = _need(args, "file")
    ckpts = res.json(rel).get("per_checkpoint") or []
    labels = _list(args, "labels")
    if not ckpts or len(labels) != len(ckpts):
        raise ReportError(f"results/{rel}: {len(ckpts)} checkpoints, labels= names {len(labels)}")
    if _need(args, "table") == "worst":
        header = ["quantity"] + [f"{lab}, {mode}" for lab in labels for mode in ("order mode", "fp32 mode")]
        rows = [[name] + [f"{c['worst'][mode][key]:#.3g}" for c in ckpts for mode in ("order", "fp32")]
                for key, name in CALIBRATION_ROWS.items()]  # fmt: skip
        return table(header, rows)
    qs = list(ckpts[0]["margin_quantiles"])
    header = ["variant"] + [f"{float(q) * 100:g} %" for q in qs]
    return table(
        header,
        [
            [lab] + [f"{c['margin_quantiles'][q]:#.3g}" for q in qs]
            for lab, c in zip(labels, ckpts, strict=True)
        ],
    )


def render_nll_shift(res: Results, args: dict[str, str]) -> str:
    """The NLL-shift tables of docs/E2E_CPU.md from a logit_rows result (results/e2e-nll-shift.json),
    by the writer's own renderer (`logit_rows --render`): per E2E prompt, and over the independent ones."""
    overlay = str(ROOT / "overlay")
    if overlay not in sys.path:
        sys.path.insert(0, overlay)
    from deepinfer_sm80.testing.e2e.logit_rows import render

    doc = res.json(_need(args, "file"))
    if "per_prompt" not in doc:
        raise ReportError(f"results/{args['file']}: not a logit_rows result (no per_prompt)")
    return render(doc)


RENDERERS: dict[str, Callable[[Results, dict[str, str]], str]] = {
    "e2e-cases": render_e2e_cases,
    "e2e-summary": render_e2e_summary,
    "e2e-engines": render_e2e_engines,
    "e2e-engine-met": render_e2e_engine_met,
    "rows": render_rows,
    "headline": render_headline,
    "grid": render_grid,
    "targets": render_targets,
    "setup": render_setup,
    "junit": render_junit,
    "junit-failures": render_junit_failures,
    "junit-new-failures": render_junit_new_failures,
    "compile-count": render_compile_count,
    "series": render_series,
    "span": render_span,
    "progress": render_progress,
    "sanitize": render_sanitize,
    "value": render_value,
    "compile": render_compile,
    "mapping": render_mapping,
    "records": render_records,
    "ab-pairs": render_ab_pairs,
    "run-wall": render_run_wall,
    "count-greater": render_count_greater,
    "serve-command": render_serve_command,
    "hardware-fit": render_hardware_fit,
    "image-smoke": render_image_smoke,
    "nll-shift": render_nll_shift,
    "oracle-calibration": render_oracle_calibration,
}


# ----------------------------------------------------------------------------- documents
def documents(root: Path) -> list[Path]:
    return sorted({p for pattern in DOCUMENTS for p in root.glob(pattern)})


def parse_args(text: str) -> dict[str, str]:
    args = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if not sep:
            raise ReportError(f"marker argument {token!r} is not key=value")
        args[key] = value
    return args


def duplicate_regions(root: Path) -> list[str]:
    """Rendered tables (same kind, same arguments in any order) that appear in more than one document.

    Each table has one home (issue 39): the topic doc owns a kernel family's tables, docs/RESULTS.md
    keeps the headline slices and points at the rest. Inline spans (a count or a value quoted in a
    sentence) may be cited wherever the sentence needs them. One line per duplicate: the region and
    its documents.
    """
    homes: dict[tuple[str, frozenset[tuple[str, str]]], set[str]] = {}
    for path in documents(root):
        where = path.relative_to(root).as_posix()
        for m in REGION.finditer(path.read_text()):
            if "\n|" not in m.group("body"):
                continue  # an inline span, not a table
            key = (m.group("kind"), frozenset(parse_args(m.group("args")).items()))
            homes.setdefault(key, set()).add(where)
    return sorted(
        f"report:{kind} {' '.join(f'{k}={v}' for k, v in sorted(args))}: {', '.join(sorted(docs))}"
        for (kind, args), docs in homes.items()
        if len(docs) > 1
    )


def render_document(text: str, res: Results, where: str) -> tuple[str, list[str]]:
    """The document with every region re-rendered, and the names of the regions that changed."""
    changed: list[str] = []

    def one(m: re.Match[str]) -> str:
        kind, body = m.group("kind"), m.group("body")
        if kind not in RENDERERS:
            raise ReportError(f"{where}: unknown report kind {kind!r} (known: {', '.join(RENDERERS)})")
        try:
            rendered = RENDERERS[kind](res, parse_args(m.group("args")))
        except ReportError as err:
            raise ReportError(f"{where}: report:{kind}{m.group('args')}: {err}") from None
        new = f"\n{rendered}\n" if "\n" in body or "\n" in rendered else rendered
        if new != body:
            changed.append(f"{where}: report:{kind}{m.group('args')}")
        return f"<!-- report:{kind}{m.group('args')} -->{new}<!-- /report:{kind} -->"

    out = REGION.sub(one, text)
    opened, closed = len(re.findall(r"<!-- report:", out)), len(re.findall(r"<!-- /report:", out))
    if opened != closed:
        raise ReportError(f"{where}: {opened} report markers opened, {closed} closed")
    return out, changed


def run(root: Path, check: bool) -> list[str]:
    res = Results(root)
    changed: list[str] = []
    for path in documents(root):
        text = path.read_text()
        new, diffs = render_document(text, res, path.relative_to(root).as_posix())
        changed += diffs
        if new != text and not check:
            path.write_text(new)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a region is stale")
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    try:
        changed = run(args.root, args.check)
    except (ReportError, json.JSONDecodeError, ET.ParseError, KeyError) as err:
        print(f"report: {err}", file=sys.stderr)
        return 2
    if args.check and changed:
        print("report: regions differ from results/ (run `make report`):\n  " + "\n  ".join(changed))
        return 1
    print(f"report: {len(changed)} regions {'would change' if args.check else 're-rendered'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
