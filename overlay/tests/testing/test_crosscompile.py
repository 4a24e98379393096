"""Every registered kernel compiles for sm_80, sm_86 and Ada sm_89 on CPU, within budget, with no spills.

Compilation runs in a subprocess: this test process may have TRITON_INTERPRET=1 set, under which
`@triton.jit` yields interpreter functions that cannot be compiled.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deepinfer_sm80.device import REPORT_BUDGETS, SM80, SM86, max_ctas_per_sm, over_budget


def _run(args, tmp_path=None):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=tmp_path)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("sm80") / "sm80-compile.json"
    proc = _run(["-m", "deepinfer_sm80.testing.sm80_report", "--json", str(out)])
    assert out.exists(), proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def test_every_registered_kernel_fits_sm80_and_sm86(report):
    proc, data = report
    kernels = data["kernels"]
    names = {k["name"] for k in kernels}
    assert {"fp8.e4m3_decode", "fp8.e4m3_encode", "fp8.ue8m0_decode"} <= names
    # upstream's Engram Triton kernels (issue 22 item 6): hash, post-WKV gate, lookback gather
    assert {
        "upstream.engram_hash_ids.n4h4",
        "upstream.engram_post_wkv.mask",
        "upstream.engram_gather_lookback",
    } <= names
    assert set(REPORT_BUDGETS) == {80, 86, 89}
    for name in names:  # upstream's hardware-fp8 writers that Ada keeps: sm_89 only
        want = {89} if name.startswith("upstream.ada.") else set(REPORT_BUDGETS)
        assert {k["arch"] for k in kernels if k["name"] == name} == want, name
    assert {"upstream.ada.kv_gather", "upstream.ada.compress_insert", "upstream.ada.indexer_k_store"} <= names
    bad = [(k["name"], k["arch"], k["problems"]) for k in kernels if k["problems"]]
    assert not bad, bad
    assert all(k["spill_bytes"] == 0 and k["regs"] > 0 for k in kernels)
    assert not [k["name"] for k in kernels if k["uses_hw_fp8"] and k["arch"] < 89]
    assert all(
        k["uses_hw_fp8"] for k in kernels if k["name"].startswith("upstream.ada.")
    )  # the detector sees it
    assert proc.returncode == 0, proc.stdout


def test_rig_catches_over_budget_and_hardware_fp8():
    proc = _run([str(Path(__file__).with_name("rig_selfcheck.py"))])
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["spilling"]["spill_bytes"] > 0
    assert any("spills" in p for p in data["spilling"]["problems"])
    big = data["big_smem"]
    assert big["smem_bytes"] > SM86.smem_per_block
    assert any("shared" in p for p in big["problems"])
    assert "fp8e4nv" in data["hw_fp8_error"]


def test_budget_arithmetic():
    # 256 threads at 128 regs: 2 CTAs/SM on SM80 (docs/MODEL.md); 255 regs at 8 warps: 1
    assert max_ctas_per_sm(SM80, 128, 0, 8) == 2
    assert max_ctas_per_sm(SM80, 255, 0, 8) == 1
    assert max_ctas_per_sm(SM86, 32, 0, 4) == 12  # thread-limited: 1536 / 128
    assert max_ctas_per_sm(SM80, 32, 80_000, 4) == 2  # smem-limited: 167936 // 81024
    assert over_budget(SM80, 40, 16, 0, 4) == ["16 B of local memory (spills)"]
    assert over_budget(SM86, 40, 0, 101_377, 4)[0].startswith("101377 B shared")
