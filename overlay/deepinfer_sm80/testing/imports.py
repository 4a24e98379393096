"""A package's import statements read with `ast`, for the tests that police its structure
(overlay/tests/test_layers.py: shipped code never imports the rig; test_import_graph.py: no import
circles). Every statement counts, at module level or inside a function."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    """The dotted name of the module at `path` under the directory `root` holding its top package
    (`pkg/a/__init__.py` -> `pkg.a`)."""
    rel = path.relative_to(root).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


Statement = tuple[int, str, tuple[str, ...]]  # (line, module named, names taken from it)


def import_statements(source: str, module: str, is_package: bool) -> Iterator[Statement]:
    """(line, the module a statement names, the names it takes from it) per statement: `import a.b`
    gives ('a.b', ()), `from a import b, c` gives ('a', ('b', 'c')). Relative imports resolve against
    `module`, which is a package (its `__init__`) when `is_package`."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                parent = here[: len(here) - (node.level - 1)]
                base = ".".join([*parent, base] if base else parent)
            yield node.lineno, base, tuple(alias.name for alias in node.names)
