"""Where a figure typed in prose comes from, and the check that it still says so (issue 39).

tests/claims_figures.py lists every figure that README.md, docs/*.md, docker/README.md and
harness/README.md type in prose outside a rendered region (`<!-- report:… -->`), each with one source:

* `Json(file, path)`: a value in a results file (`file` relative to results/, `path` dotted as
  `report:value`'s); the figure must equal it at the decimals it shows, after `scale` (the value is
  divided by it: bytes shown in GiB, a fraction shown as a percentage).
* `Const("file.py:NAME")`: a constant of the code (a top-level assignment, read with `ast`, never
  imported; `NAME.key` or `NAME.0` goes into a dict or tuple).
* `Call("package.module:function", args, path)`: what the code computes (imported: the overlay's
  own arithmetic, e.g. `ops.o_proj.wo_a_bytes(2)`), `path` into its result.
* `Code(what, fn)`: what the overlay's code computes where one call does not reach (`fn` takes no
  arguments; `what` says it as the reader should read it), e.g. a pipeline plan's payload.
* `Text(file, pattern)`: a value written in another file of the repository (a Dockerfile's ARG, a
  profile's flag): `pattern` is a regex whose first group is the number.
* `Quoted(whose, label)`: a figure the project quotes (a vendor's datasheet, upstream's code or docs,
  the seed write-up): `whose` says whose, and the sentence that carries it (or, in a table, its header
  or the paragraph above it) must label it: `label` is a regex that must match there.
* `Calc(expr, **sources)`: arithmetic over other sources (`expr` a Python expression over their names
  and literal numbers), e.g. the 576-byte-rounded page size from the code's constants.
* `Defined(why)`: a figure the sentence itself defines (a flag value in an example command, a setting
  the doc prescribes, a step in an explanation), not a measurement or a fact held elsewhere; `why`
  says which. Kept for what truly has no other home.
"""

from __future__ import annotations

import ast
import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # code and pins are read here; results/ under the root checked
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def shown(figure: str) -> tuple[float, int]:
    """The number a figure shows and its decimals: '5,530,310' -> (5530310, 0), '1.56×' -> (1.56, 2)."""
    m = NUMBER.search(figure)
    if not m:
        raise ValueError(f"no number in {figure!r}")
    text = m.group(0).replace(",", "")
    return float(text), len(text.split(".")[1]) if "." in text else 0


def agrees(figure: str, value: float) -> bool:
    """The figure shows the value at its decimals (its sign is the prose's: -3.5 is the figure 3.5)."""
    number, digits = shown(figure)
    value = abs(value)
    return math.isclose(round(value, digits), number, rel_tol=0, abs_tol=10 ** -(digits + 3)) or abs(
        value - number
    ) <= 0.5 * 10**-digits * (1 + 1e-9)


def _walk(node: object, path: str, where: str) -> object:
    """Dotted path into dicts, lists and objects; a dict key holding dots ("0.05") is matched whole."""
    parts = path.split(".")
    i = 0
    while i < len(parts):
        key = parts[i]
        if isinstance(node, list | tuple) and re.fullmatch(r"-?\d+", key):
            node = node[int(key)]
        elif isinstance(node, dict):
            for j in range(len(parts), i, -1):
                if ".".join(parts[i:j]) in node:
                    node, i = node[".".join(parts[i:j])], j - 1
                    break
            else:
                raise LookupError(f"{where}: no {path!r}")
        elif not isinstance(node, list | tuple) and hasattr(node, key):
            node = getattr(node, key)
        else:
            raise LookupError(f"{where}: no {path!r}")
        i += 1
    return node


def _literal(node: ast.AST, names: dict[str, object]) -> object:
    """A constant expression: literals, names assigned before it, + - * / // ** << >>, int(), float()."""
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.BinOp):
        a, b = _literal(node.left, names), _literal(node.right, names)
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
               ast.Div: lambda: a / b, ast.FloorDiv: lambda: a // b, ast.Pow: lambda: a**b,
               ast.LShift: lambda: a << b, ast.RShift: lambda: a >> b}  # fmt: skip
        return ops[type(node.op)]()  # type: ignore[operator]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_literal(node.operand, names)  # type: ignore[operator]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("int", "float"):
        return {"int": int, "float": float}[node.func.id](_literal(node.args[0], names))  # type: ignore[call-overload]
    if isinstance(node, ast.Dict):
        return {_literal(k, names): _literal(v, names) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]
    if isinstance(node, ast.Tuple | ast.List):
        return [_literal(e, names) for e in node.elts]
    return ast.literal_eval(node)


def constants(path: Path) -> dict[str, object]:
    """Top-level `NAME = <constant expression>` (`NAME: T = …`, `A, B = 1, 2`) of a Python file, in order."""
    names: dict[str, object] = {}
    for stmt in ast.parse(path.read_text()).body:
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        for target in targets:
            try:
                if isinstance(target, ast.Name):
                    names[target.id] = _literal(value, names)
                elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):  # A, B = 1, 2
                    for t, v in zip(target.elts, value.elts, strict=True):
                        if isinstance(t, ast.Name):
                            names[t.id] = _literal(v, names)
            except (ValueError, KeyError, TypeError, ZeroDivisionError, AttributeError):
                pass
    return names


def _t_sf(x: float, df: float) -> float:
    """P(T > x) of Student's t with df degrees of freedom."""
    from scipy import stats

    return float(stats.t.sf(x, df))


def _t_ppf(q: float, df: float) -> float:
    from scipy import stats

    return float(stats.t.ppf(q, df))


CALC_FUNCTIONS = {
    "min": min,
    "mean": lambda *xs: sum(xs) / len(xs),
    "max": max,
    "ceil": math.ceil,
    "log": math.log,
    "log2": math.log2,
    "sqrt": math.sqrt,
    "t_sf": _t_sf,
    "t_ppf": _t_ppf,
}


class Source:
    def value(self, root: Path) -> float:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Json(Source):
    file: str
    path: str
    scale: float = 1.0

    def value(self, root: Path) -> float:
        where = f"results/{self.file}"
        node = _walk(json.loads((root / "results" / self.file).read_text()), self.path, where)
        if isinstance(node, str) and re.match(r"\d+(?:\.\d+)?", node):  # a version: '2.11.0+cu130'
            node = float(re.match(r"\d+(?:\.\d+)?", node).group(0))  # type: ignore[union-attr]
        if isinstance(node, bool) or not isinstance(node, int | float):
            raise LookupError(f"{where}: {self.path!r} is {node!r}, not a number")
        return node / self.scale

    def describe(self) -> str:
        return f"results/{self.file} {self.path}" + (f" / {self.scale:g}" if self.scale != 1 else "")


@dataclass(frozen=True)
class Const(Source):
    ref: str  # "path/to/file.py:NAME" or "path/to/file.py:NAME.key"
    scale: float = 1.0

    def value(self, root: Path) -> float:
        file, _, name = self.ref.partition(":")
        head, _, rest = name.partition(".")
        table = constants(REPO / file)
        if head not in table:
            raise LookupError(f"{file}: no constant {head}")
        node = _walk(table[head], rest, self.ref) if rest else table[head]
        if isinstance(node, bool) or not isinstance(node, int | float):
            raise LookupError(f"{self.ref} is {node!r}, not a number")
        return node / self.scale

    def describe(self) -> str:
        return self.ref + (f" / {self.scale:g}" if self.scale != 1 else "")


@dataclass(frozen=True)
class Call(Source):
    ref: str  # "package.module:name" under overlay/: a function (called with args) or an object
    args: tuple = ()
    path: str = ""  # into the result, dotted
    scale: float = 1.0

    def value(self, root: Path) -> float:
        import importlib

        if str(REPO / "overlay") not in sys.path:
            sys.path.insert(0, str(REPO / "overlay"))
        module, _, name = self.ref.partition(":")
        node: object = importlib.import_module(module)
        for part in name.split("."):  # "V41.per_rank": an attribute of an object
            node = getattr(node, part)
        node = node(*self.args) if callable(node) else node
        node = _walk(node, self.path, self.ref) if self.path else node
        return float(node) / self.scale  # type: ignore[arg-type]

    def describe(self) -> str:
        return f"{self.ref}{self.args}" + (f"[{self.path}]" if self.path else "")


@dataclass(frozen=True)
class Code(Source):
    what: str  # the expression, as the reader should read it
    fn: Callable[[], float] = field(compare=False)

    def value(self, root: Path) -> float:
        if str(REPO / "overlay") not in sys.path:
            sys.path.insert(0, str(REPO / "overlay"))
        return float(self.fn())

    def describe(self) -> str:
        return self.what


@dataclass(frozen=True)
class Text(Source):
    file: str
    pattern: str  # its first group is the number
    scale: float = 1.0

    def value(self, root: Path) -> float:
        m = re.search(self.pattern, (REPO / self.file).read_text(), re.M)
        if not m:
            raise LookupError(f"{self.file}: no match for {self.pattern!r}")
        return float(m.group(1).replace(",", "")) / self.scale

    def describe(self) -> str:
        return f"{self.file} /{self.pattern}/"


@dataclass(frozen=True)
class Quoted(Source):
    whose: str  # "vendor: NVIDIA A100 datasheet", "upstream: vLLM 0.32.0 …", "seed: …"
    label: str  # a regex the sentence (a table: its header or the paragraph above) must match

    def describe(self) -> str:
        return self.whose


@dataclass(frozen=True)
class Calc(Source):
    expr: str
    args: dict[str, Source] = field(default_factory=dict)

    def __init__(self, expr: str, **args: Source) -> None:
        object.__setattr__(self, "expr", expr)
        object.__setattr__(self, "args", args)

    def value(self, root: Path) -> float:
        env = {k: s.value(root) for k, s in self.args.items()}
        return float(eval(self.expr, {"__builtins__": {}, **CALC_FUNCTIONS}, env))

    def describe(self) -> str:
        return f"{self.expr} with " + ", ".join(f"{k} = {s.describe()}" for k, s in self.args.items())

    def __hash__(self) -> int:
        return hash((self.expr, tuple(sorted(self.args))))


@dataclass(frozen=True)
class Defined(Source):
    why: str

    def describe(self) -> str:
        return f"defined here: {self.why}"


@dataclass(frozen=True)
class Figure:
    doc: str  # relative to the repository root
    figure: str  # as the prose writes it (FIGURE's match)
    where: str  # words of its sentence (whitespace collapsed): which occurrences this entry holds
    source: Source
