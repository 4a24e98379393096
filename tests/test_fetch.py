"""fetch-vllm refuses a tampered wheel with a one-line error and keeps the file for inspection."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from fetch_vllm import extract_tree
from fetch_wheel import ChecksumError, fetch, sha256_of
from pins import load_pins

ROOT = Path(__file__).resolve().parent.parent


def test_tampered_wheel_is_refused_and_kept(tmp_path):
    pins = load_pins()
    wheel = tmp_path / pins["VLLM_WHEEL"]
    wheel.write_bytes(b"not the wheel")
    with pytest.raises(ChecksumError, match="does not match the pinned"):
        fetch("vllm==0", pins["VLLM_WHEEL"], pins["VLLM_WHEEL_SHA256"], tmp_path)
    assert not wheel.exists()
    assert wheel.with_suffix(".rejected").read_bytes() == b"not the wheel"


def test_make_fetch_vllm_cli_rejects_tampered_cache(tmp_path):
    pins = load_pins()
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / pins["VLLM_WHEEL"]).write_bytes(b"\0" * 1024)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fetch_vllm.py"), str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing it" in lines[0], proc.stderr
    assert not (tmp_path / f"vllm-{pins['VLLM_VERSION']}").exists()


def test_extract_keeps_python_and_dist_info_only(tmp_path):
    wheel = tmp_path / "fake.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm/__init__.py", "")
        zf.writestr("vllm/_C.abi3.so", "binary")
        zf.writestr("vllm/third_party/x.py", "")
        zf.writestr("vllm-9.dist-info/METADATA", "Name: vllm")
    tree = extract_tree(wheel, sha256_of(wheel), tmp_path / "tree")
    files = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file())
    assert files == [".extracted-from-sha256", "vllm-9.dist-info/METADATA", "vllm/__init__.py"]
    assert extract_tree(wheel, sha256_of(wheel), tmp_path / "tree") == tree  # idempotent


def test_fetched_tree_is_the_pinned_release():
    pins = load_pins()
    tree = ROOT / ".cache" / f"vllm-{pins['VLLM_VERSION']}"
    if not tree.exists():
        pytest.skip("run make fetch-vllm first (make test does)")
    assert (tree / ".extracted-from-sha256").read_text().strip() == pins["VLLM_WHEEL_SHA256"]
    assert (tree / f"vllm-{pins['VLLM_VERSION']}.dist-info" / "METADATA").exists()
    assert (tree / "vllm/models/deepseek_v41/common/ops/cache_utils.py").exists()
