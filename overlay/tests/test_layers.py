"""The verification rig stands above the shipped code: nothing under ops/, formats/ or integration/ (nor
the binding table, the registry or the device facts) imports `deepinfer_sm80.testing`, at module level
or inside a function. An AST scan, so a lazy import counts too."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepinfer_sm80.testing.imports import import_statements, module_name

PACKAGE = Path(__file__).resolve().parents[1] / "deepinfer_sm80"
SHIPPED = ("ops", "formats", "integration")
SHIPPED_MODULES = ("bindings.py", "table.py", "hook.py", "registry.py", "device.py", "__init__.py")
RIG = "deepinfer_sm80.testing"


def shipped_files() -> list[Path]:
    files = [p for d in SHIPPED for p in sorted((PACKAGE / d).rglob("*.py"))]
    files += [PACKAGE / name for name in SHIPPED_MODULES if (PACKAGE / name).exists()]
    return files


def rig_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """`module`'s imports of the rig, as 'line: dotted name' (relative imports resolved against `module`)."""
    found = []
    for line, base, names in import_statements(source, module, is_package):
        dotted = [base] + [f"{base}.{n}" for n in names]
        found += [f"{line}: {n}" for n in dotted if n == RIG or n.startswith(RIG + ".")]
    return sorted(set(found))


def test_scan_sees_the_shipped_tree():
    files = shipped_files()
    assert any(f.parent.name == "ops" for f in files) and any(f.parent.name == "integration" for f in files)


@pytest.mark.parametrize(
    "source",
    [
        "from deepinfer_sm80.testing.shapes import V41",
        "import deepinfer_sm80.testing.inputs",
        "def f():\n    from deepinfer_sm80.testing import budgets\n",
        "from deepinfer_sm80 import testing",
    ],
)
def test_scan_finds_a_rig_import(source):
    assert rig_imports(source, "deepinfer_sm80.ops.x")


def test_scan_resolves_relative_imports():
    assert rig_imports("from ..testing import inputs", "deepinfer_sm80.ops.x")
    assert not rig_imports("from .kernels import x", "deepinfer_sm80.ops.mhc.jit")


def test_shipped_code_does_not_import_the_rig():
    bad = {}
    for path in shipped_files():
        hits = rig_imports(path.read_text(), module_name(path, PACKAGE.parent), path.name == "__init__.py")
        if hits:
            bad[str(path.relative_to(PACKAGE))] = hits
    assert not bad, f"shipped modules import the verification rig: {bad}"
