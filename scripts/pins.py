"""Reads docker/versions.env, the project's one pin file, for scripts and tests."""

from __future__ import annotations

from pathlib import Path

PINS_FILE = Path(__file__).resolve().parent.parent / "docker" / "versions.env"


def load_pins(path: Path = PINS_FILE) -> dict[str, str]:
    """Return KEY -> value for every `KEY=value` line of the pin file."""
    pins: dict[str, str] = {}
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"{path}:{lineno}: expected KEY=value, got {raw!r}")
        pins[key] = value
    return pins


if __name__ == "__main__":
    import sys

    print(load_pins()[sys.argv[1]])
