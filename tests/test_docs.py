"""Every reference in the repository resolves inside it: nothing points at material outside the repo."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# design notes that live outside the repository; users and new contributors cannot open them
OUTSIDE = re.compile(r"\.\./shared|shared/docs|\b(SPEC|HARNESS|STYLE|GPU_BUNDLE|SM80_CENSUS)\.md\b")
DOC_LINK = re.compile(r"\bdocs/([A-Z0-9_]+\.md)")


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = [ROOT / p for p in out.splitlines()]
    return [p for p in files if p.is_file() and p.suffix not in {".png", ".gz", ".svg", ".whl"}]


def test_no_reference_leaves_the_repository():
    hits = []
    for path in tracked_text_files():
        if path == Path(__file__).resolve():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "references outside the repository:\n" + "\n".join(hits[:40])


def test_every_docs_reference_exists():
    missing = set()
    for path in tracked_text_files():
        for name in DOC_LINK.findall(path.read_text(errors="replace")):
            if not (ROOT / "docs" / name).exists():
                missing.add(f"docs/{name} (in {path.relative_to(ROOT)})")
    assert not missing, "dangling docs/ references:\n" + "\n".join(sorted(missing))
