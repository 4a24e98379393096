"""The oracle stands apart from what it checks: importing it loads neither vLLM nor any other part of
deepinfer_sm80, and no module of the package imports them (a lazy import would escape the first check)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import deepinfer_sm80.testing.oracle as oracle_pkg

PKG = Path(oracle_pkg.__file__).resolve().parent
ALLOWED_OWN = {"deepinfer_sm80", "deepinfer_sm80.testing"}  # package __init__s: docstrings only


def test_import_loads_nothing_it_checks() -> None:
    code = (
        "import json, sys\n"
        "import deepinfer_sm80.testing.oracle as o\n"
        "from deepinfer_sm80.testing.oracle import dspark, model\n"
        "roots = ('vllm', 'deepinfer_sm80', 'triton')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in roots)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    mods = json.loads(out.stdout.strip().splitlines()[-1])
    foreign = [m for m in mods if m not in ALLOWED_OWN and not m.startswith("deepinfer_sm80.testing.oracle")]
    assert foreign == [], f"the oracle pulled in {foreign}"
    assert "deepinfer_sm80.testing.oracle.model" in mods


def test_no_module_imports_vllm_or_the_rest_of_the_package() -> None:
    bad = []
    files = sorted(PKG.glob("*.py"))
    assert len(files) >= 9
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for n in names:
                if n.split(".")[0] in ("vllm", "triton") or (
                    n.startswith("deepinfer_sm80") and not n.startswith("deepinfer_sm80.testing.oracle")
                ):
                    bad.append(f"{f.name}: {n}")
    assert bad == []
