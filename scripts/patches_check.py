"""`make patches-check`: the committed series is what the table generates, and applies cleanly.

On a scratch copy of the files the series touches (sha256-checked against the pinned wheel's RECORD):
every patch applies with no fuzz and no offset, every patched file byte-compiles, a second
application is refused, and reverting in reverse order restores the wheel's hashes (files patch 01
created are gone again). Exit 1 with a one-line reason on the first failure.

Usage: python scripts/patches_check.py [--tree DIR]
"""

from __future__ import annotations

import argparse
import py_compile
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_patches import (
    ROOT,
    Tree,
    TreeError,
    default_tree,
    generate,
    open_tree,
    record_hash,
    touched_files,
)

PATCHES = ROOT / "patches"


class CheckError(Exception):
    pass


def series() -> list[Path]:
    names = [line.strip() for line in (PATCHES / "series").read_text().splitlines() if line.strip()]
    return [PATCHES / name for name in names]


def _patch(work: Path, patch: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["patch", "-p1", "--batch", "--fuzz=0", "-d", str(work), "-i", str(patch), *extra],
        capture_output=True,
        text=True,
    )


def scratch_copy(tree: Tree, work: Path, files: list[str]) -> None:
    """Copy the files the series touches, after checking each against RECORD."""
    for rel in files:
        if rel not in tree.record:
            continue  # created by a patch
        tree.read(rel)  # raises on a hash mismatch
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tree.root / rel, work / rel)


def check(tree: Tree) -> list[str]:
    """Run every check; returns the report lines, raises CheckError on the first failure."""
    report: list[str] = []
    patches = series()
    on_disk = sorted(p.name for p in PATCHES.glob("*.patch"))
    if sorted(p.name for p in patches) != on_disk:
        raise CheckError(f"series lists {[p.name for p in patches]}, patches/ holds {on_disk}")
    generated = generate(tree)
    for patch in patches:
        if generated.get(patch.name) != patch.read_text():
            raise CheckError(f"{patch.name} is not what the binding table generates; run make patches")
    report.append(f"{len(patches)} patches are the generated ones")
    files = sorted({rel for p in patches for rel in touched_files(p.read_text())})
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        scratch_copy(tree, work, files)
        for patch in patches:
            proc = _patch(work, patch, "--forward")
            said = proc.stdout + proc.stderr
            if proc.returncode != 0 or "fuzz" in said or "offset" in said:
                raise CheckError(f"{patch.name} does not apply cleanly: {said.strip()}")
        report.append(f"series applies with no fuzz or offset to {len(files)} files")
        for rel in files:
            try:
                py_compile.compile(str(work / rel), cfile=str(work / (rel + "c")), doraise=True)
            except py_compile.PyCompileError as exc:
                raise CheckError(f"{rel} does not byte-compile after patching: {exc.msg}") from exc
        report.append(f"{len(files)} patched files byte-compile")
        for patch in patches:
            proc = _patch(work, patch, "--forward", "--dry-run")
            if proc.returncode == 0:
                raise CheckError(f"{patch.name} applies a second time; it must be refused")
        report.append("a second application of each patch is refused")
        for patch in reversed(patches):
            proc = _patch(work, patch, "-R", "--remove-empty-files")
            if proc.returncode != 0:
                raise CheckError(f"{patch.name} does not revert: {(proc.stdout + proc.stderr).strip()}")
        for rel in files:
            path = work / rel
            if rel not in tree.record:
                if path.exists():
                    raise CheckError(f"{rel} is left behind after reverting")
            elif record_hash(path.read_bytes()) != tree.record[rel]:
                raise CheckError(f"{rel}: reverting does not restore the wheel's sha256")
        report.append("reverting restores every file's wheel sha256")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        for line in check(open_tree(args.tree or default_tree())):
            print(f"patches-check: {line}")
    except (TreeError, CheckError) as exc:
        print(f"patches-check: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
