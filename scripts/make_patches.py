"""`make patches`: generate patches/00 and 01 from the pinned vLLM tree and the binding table.

Patch 00 appends the same two-line hook to every upstream module that has rows in
`deepinfer_sm80.bindings.BINDINGS`, and changes nothing else; what the hook binds, and on which GPUs,
lives in the table. Patch 01 creates the level marker module only. Every source file is checked
against the wheel's RECORD (and the tree against the pinned wheel sha256) before it is diffed.

Usage: python scripts/make_patches.py [--tree DIR] [--out DIR] [--check]
  --check: regenerate into memory and fail (exit 1) if patches/ differs.
"""

from __future__ import annotations

import argparse
import base64
import difflib
import hashlib
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "overlay"))

from pins import load_pins  # noqa: E402

STAMP = ".extracted-from-sha256"  # written by fetch_vllm.py: the wheel the tree came from
PATCH_00 = "00-sm80-base-enablement.patch"
PATCH_01 = "01-deepinfer-optimizations.patch"
HOOK_COMMENT = "# DeepInfer-SM80 patch 00: apply the rows of deepinfer_sm80/bindings.py for this module."
HOOK_LINE = (
    "from deepinfer_sm80.bindings import rebind; rebind(globals(), __name__)  # noqa: E402, E702, I001"
)
LEVEL_MODULE = "vllm/deepinfer_sm80_level.py"
LEVEL_TEXT = (
    '"""DeepInfer-SM80 patch 01: selects the optimized rows of deepinfer_sm80/bindings.py."""\n'
    "\n"
    'LEVEL = "optimized"\n'
)
# Files patch 01 creates: path -> text (issue 16 adds its own here).
PATCH_01_NEW_FILES: dict[str, str] = {LEVEL_MODULE: LEVEL_TEXT}


class TreeError(Exception):
    """The tree is missing, not the pinned one, or a file differs from the wheel's RECORD."""


@dataclass(frozen=True)
class Tree:
    root: Path  # holds vllm/ and vllm-<version>.dist-info/
    record: dict[str, str]  # path -> "sha256=<urlsafe b64>"

    def read(self, rel: str) -> str:
        """The file's text, after checking its bytes against RECORD."""
        data = (self.root / rel).read_bytes()
        want = self.record.get(rel)
        if want is None:
            raise TreeError(f"{rel}: not in the wheel's RECORD")
        if record_hash(data) != want:
            raise TreeError(f"{rel}: sha256 differs from the wheel's RECORD (tree modified?)")
        return data.decode()


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def default_tree() -> Path:
    return ROOT / ".cache" / f"vllm-{load_pins()['VLLM_VERSION']}"


def open_tree(root: Path) -> Tree:
    pins = load_pins()
    stamp = root / STAMP
    if not stamp.exists():
        raise TreeError(f"{root}: no {STAMP}; run make fetch-vllm")
    if stamp.read_text().strip() != pins["VLLM_WHEEL_SHA256"]:
        raise TreeError(f"{root}: extracted from a wheel other than VLLM_WHEEL_SHA256")
    records = list(root.glob(f"vllm-{pins['VLLM_VERSION']}.dist-info/RECORD"))
    if len(records) != 1:
        raise TreeError(f"{root}: no vllm-{pins['VLLM_VERSION']}.dist-info/RECORD")
    record: dict[str, str] = {}
    for line in records[0].read_text().splitlines():
        path, digest, _size = line.rsplit(",", 2)
        if digest:
            record[path] = digest
    return Tree(root, record)


def module_path(tree: Tree, module: str) -> str:
    """vllm.a.b -> vllm/a/b.py, or vllm/a/b/__init__.py for a package."""
    base = module.replace(".", "/")
    for rel in (f"{base}.py", f"{base}/__init__.py"):
        if rel in tree.record:
            return rel
    raise TreeError(f"{module}: no such module in the pinned wheel")


def hooked(text: str, rel: str) -> str:
    """Upstream text with the hook appended (one blank line pair, PEP 8)."""
    if not text.endswith("\n"):
        raise TreeError(f"{rel}: does not end with a newline")
    if "\nrebind" in text or "import rebind" in text:
        raise TreeError(f"{rel}: already defines or imports `rebind`; the hook would shadow it")
    return text.rstrip("\n") + "\n\n\n" + HOOK_COMMENT + "\n" + HOOK_LINE + "\n"


def unified(rel: str, old: str | None, new: str) -> str:
    """git-style unified diff with 3 context lines; old=None creates the file."""
    old_lines = [] if old is None else old.splitlines(keepends=True)
    diff = difflib.unified_diff(
        old_lines,
        new.splitlines(keepends=True),
        fromfile="/dev/null" if old is None else f"a/{rel}",
        tofile=f"b/{rel}",
        n=3,
    )
    out = "".join(diff)
    if old is None:  # difflib writes "-0,0" for an empty side; patch(1) wants it so, keep it
        out = out.replace("@@ -1,0 ", "@@ -0,0 ")
    return out


def hooked_modules() -> tuple[str, ...]:
    from deepinfer_sm80.bindings import hooked_modules as from_table

    return from_table()


def patch_00(tree: Tree, modules: Iterable[str]) -> str:
    parts = []
    for rel in sorted(module_path(tree, m) for m in modules):
        text = tree.read(rel)
        parts.append(unified(rel, text, hooked(text, rel)))
    return "".join(parts)


def patch_01(tree: Tree) -> str:
    parts = []
    for rel, text in sorted(PATCH_01_NEW_FILES.items()):
        if rel in tree.record:
            raise TreeError(f"{rel}: patch 01 would create a file the wheel already has")
        parts.append(unified(rel, None, text))
    return "".join(parts)


def generate(tree: Tree) -> dict[str, str]:
    """patch file name -> content."""
    return {PATCH_00: patch_00(tree, hooked_modules()), PATCH_01: patch_01(tree)}


def touched_files(patch_text: str) -> list[str]:
    """Paths (relative to the tree) a generated patch modifies or creates."""
    return [line[len("+++ b/") :].strip() for line in patch_text.splitlines() if line.startswith("+++ b/")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "patches")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    try:
        generated = generate(open_tree(args.tree or default_tree()))
    except TreeError as exc:
        print(f"make_patches: {exc}", file=sys.stderr)
        return 1
    stale = [n for n, text in generated.items() if (args.out / n).read_text() != text] if args.check else []
    if args.check:
        if stale:
            print(
                f"make_patches: {', '.join(stale)} differ from the table; run make patches", file=sys.stderr
            )
            return 1
        print(f"make_patches: {len(generated)} patches match the binding table")
        return 0
    for name, text in generated.items():
        path = args.out / name
        if not path.exists() or path.read_text() != text:  # idempotent: unchanged files are not rewritten
            path.write_text(text)
    series = args.out / "series"
    want = "".join(f"{n}\n" for n in generated)
    if not series.exists() or series.read_text() != want:
        series.write_text(want)
    for name, text in generated.items():
        print(f"make_patches: {name}: {', '.join(touched_files(text))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
