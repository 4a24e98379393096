"""The CPU end-to-end run's scaffolding (the engine run itself is `make e2e-cpu`, docs/E2E_CPU.md).

Cheap checks that need no engine: bad input fails in one line before any engine starts; the scratch
tree is the patched wheel and a second prepare is a no-op; the stand-ins stay out of every CUDA
import path (nothing outside testing/e2e imports them, and the startup hook does nothing unless
DEEPINFER_E2E_CPU=1).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "overlay" / "deepinfer_sm80"
PY = sys.executable


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "deepinfer_sm80.testing.e2e", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def test_missing_checkpoint_dir_is_one_line(tmp_path: Path) -> None:
    proc = _cli("--model", str(tmp_path / "nope"), "--work", str(tmp_path / "w"))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no such checkpoint directory" in proc.stderr
    assert not (tmp_path / "w").exists()


def test_checkpoint_without_config_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    proc = _cli("--model", str(tmp_path / "ckpt"), "--work", str(tmp_path / "w"))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no config.json" in proc.stderr


@pytest.mark.parametrize("model_type", ["llama", None])
def test_non_v41_model_type_is_one_line(tmp_path: Path, model_type: str | None) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": model_type}))
    proc = _cli("--model", str(tmp_path / "ckpt"), "--work", str(tmp_path / "w"))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "is not DeepSeek-V4.1" in proc.stderr


def test_unknown_level_is_one_line(tmp_path: Path) -> None:
    proc = _cli("--levels", "turbo", "--work", str(tmp_path / "w"))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "level must be one of" in proc.stderr


def test_no_module_outside_e2e_imports_the_standins() -> None:
    pattern = re.compile(r"testing\.e2e|testing import e2e|from \. import standins|standins")
    offenders = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith("testing/e2e/"):
            continue
        if pattern.search(path.read_text()):
            offenders.append(rel)
    assert offenders == []


def test_cuda_import_path_never_loads_the_standins() -> None:
    """Every module the patch-00 hook can import (bindings + each row's target) without the switch."""
    code = (
        "import sys\n"
        "from deepinfer_sm80 import bindings\n"
        "mods = {t.split(':')[0] for b in bindings.BINDINGS for t in (b.base, b.optimized) if t}\n"
        "import importlib\n"
        "for m in sorted(mods):\n"
        "    importlib.import_module(m)\n"
        "bad = [m for m in sys.modules if m.startswith('deepinfer_sm80.testing.e2e')]\n"
        "print(len(mods), bad)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DEEPINFER_E2E_CPU"}
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    count, bad = proc.stdout.strip().split(" ", 1)
    assert int(count) > 5 and bad == "[]"


def test_startup_hook_is_inert_without_the_switch() -> None:
    hook = PKG / "testing" / "e2e" / "hook"
    env = {k: v for k, v in os.environ.items() if k != "DEEPINFER_E2E_CPU"}
    env["PYTHONPATH"] = os.pathsep.join([str(hook), env.get("PYTHONPATH", "")])
    code = "import sys; print([m for m in sys.modules if 'e2e' in m or m == 'vllm'])"
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


@pytest.mark.skipif(
    not (ROOT / ".cache" / "vllm-0.32.0" / ".extracted-from-sha256").exists(), reason="make fetch-vllm first"
)
def test_scratch_tree_is_the_patched_wheel_and_idempotent(tmp_path: Path) -> None:
    from deepinfer_sm80.testing.e2e import server_env

    env = server_env("base", tmp_path)
    site = Path(env["PYTHONPATH"].split(os.pathsep)[2])
    hooked = site / "vllm" / "models" / "deepseek_v41" / "common" / "ops" / "cache_utils.py"
    assert "rebind(globals(), __name__)" in hooked.read_text()
    assert not (site / "vllm" / "deepinfer_sm80_level.py").exists()
    assert any(site.glob("vllm/_C*.so"))
    stamp = (site / ".e2e-tree-digest").stat().st_mtime_ns
    assert server_env("deepinfer", tmp_path)["PYTHONPATH"].split(os.pathsep)[2].endswith("optimized/site")
    server_env("base", tmp_path)
    assert (site / ".e2e-tree-digest").stat().st_mtime_ns == stamp
    assert (tmp_path / "optimized" / "site" / "vllm" / "deepinfer_sm80_level.py").exists()
    assert env["TRITON_INTERPRET"] == "1" and env["DEEPINFER_SM80_FORCE_CAPABILITY"] == "80"


def test_required_rows_are_binding_rows() -> None:
    """A typo in a required row would make its target unmeetable or, worse, never asked for."""
    from deepinfer_sm80.bindings import BINDINGS
    from deepinfer_sm80.testing.e2e import runner

    names = {b.name for b in BINDINGS}
    for kind in ("ci", "full"):
        for engine in runner.plan(kind, engram=True):
            for case in engine.cases:
                for level, rows in case.rows.items():
                    assert level in runner.LEVELS and rows, (engine.name, case.name)
                    assert set(rows) <= names, set(rows) - names
    assert set(runner.LOAD_ROWS) <= names


def test_indexer_gather_standin_reads_the_planar_pages() -> None:
    """The cp_gather stand-in returns each request's states in order, codes and scales, from its blocks."""
    import torch

    from deepinfer_sm80.formats.indexer_k import make_k_cache, state_views
    from deepinfer_sm80.testing.e2e.standins import cp_gather_indexer_k_quant_cache

    gen = torch.Generator().manual_seed(7)
    k_cache = make_k_cache(4, 8)
    codes, scales = state_views(k_cache)
    codes.copy_(torch.randint(0, 256, codes.shape, dtype=torch.uint8, generator=gen))
    scales.copy_(torch.exp2(torch.randint(-4, 4, scales.shape, generator=gen).float()))
    block_table = torch.tensor([[2, 0, -1], [3, 1, -1]], dtype=torch.int32)
    cu = torch.tensor([0, 11, 14], dtype=torch.int32)
    dst_k = torch.full((14, 128), 0xFF, dtype=torch.uint8)
    dst_s = torch.full((14, 4), 0xFF, dtype=torch.uint8)
    cp_gather_indexer_k_quant_cache(k_cache, dst_k, dst_s, block_table, cu)
    for row, (req, pos) in enumerate([(0, p) for p in range(11)] + [(1, p) for p in range(3)]):
        block = int(block_table[req, pos // 8])
        assert torch.equal(dst_k[row], codes[block, pos % 8])
        assert torch.equal(dst_s[row].view(torch.float32), scales[block, pos % 8].reshape(1))


class _FixedOracle:
    """Oracle stand-in for compare_case: fixed peaked logits per sequence (a scaled Gaussian)."""

    def __init__(self, vocab: int = 64, scale: float = 8.0) -> None:
        self.vocab, self.scale = vocab, scale
        self.t = {"compress_ratios": [0], "num_hidden_layers": 1, "index_topk": 512}

    def logits(self, token_ids: list[int]) -> torch.Tensor:
        g = torch.Generator().manual_seed(len(token_ids))
        return torch.randn(len(token_ids), self.vocab, generator=g) * self.scale


def _engine_result(oracle: _FixedOracle, prompt: list[int], logit_scale: float, noise: float) -> dict:
    logp = torch.log_softmax(oracle.logits(prompt) * logit_scale, dim=-1)
    g = torch.Generator().manual_seed(7)
    noises = (noise * torch.randn(len(prompt), generator=g)).tolist()
    lp = [float(logp[i - 1, prompt[i]]) + noises[i] for i in range(1, len(prompt))]
    return {"prompt": prompt, "tokens": [], "prompt_logprobs": lp}


def test_shift_statistic_tells_a_systematic_error_from_noise() -> None:
    from deepinfer_sm80.testing.e2e.compare import compare_case, shift_stats

    oracle = _FixedOracle()
    prompt = [int(i) for i in torch.randint(0, 64, (48,), generator=torch.Generator().manual_seed(3))]
    noisy = compare_case(oracle, _engine_result(oracle, prompt, 1.0, noise=0.4))
    scaled = compare_case(oracle, _engine_result(oracle, prompt, 1.03, noise=0.02))  # 3 % logit scale
    print("z: noisy", noisy["nll_shift_z"], "scaled", scaled["nll_shift_z"])
    assert abs(noisy["nll_shift_z"]) < 3.0 and scaled["nll_shift_z"] > 3.0
    assert noisy["noise_sd"]["engine"] == pytest.approx(0.4, rel=0.35)
    assert shift_stats([0.5, 0.5, 0.5])["z"] == math.inf and shift_stats([0.0, 0.0])["z"] == 0.0
    assert shift_stats([0.5])["z"] is None


def test_nll_shift_gate_is_a_failing_target() -> None:
    from deepinfer_sm80.testing.e2e.runner import NLL_SHIFT_Z, _target

    t = _target("x/prompt_nll_shift_abs_z", 4.2, NLL_SHIFT_Z, "standard errors", "max", True, "shift")
    assert not t["met"] and t["direction"] == "<="
    assert not _target("x", None, NLL_SHIFT_Z, "standard errors", "max", True)["met"]


def test_z_spread_is_the_measured_one() -> None:
    """NLL_Z_SPREAD is the SD of a prompt's own z under noise alone, measured on 16 independent prompts
    (results/e2e-nll-shift.json): the constant may not drift from the engine's measured value, and the
    oracle against its own order mode (pure noise) spreads as much."""
    from deepinfer_sm80.testing.e2e.runner import NLL_Z_SPREAD

    measured = json.loads((ROOT / "results" / "e2e-nll-shift.json").read_text())["independent"]
    engine, order = measured["engine"]["residual_z_sd"], measured["oracle_order"]["residual_z_sd"]
    print("z spread: engine", engine, "oracle order mode", order, "constant", NLL_Z_SPREAD)
    assert abs(NLL_Z_SPREAD - engine) / engine < 0.05
    assert abs(NLL_Z_SPREAD - order) / order < 0.05


def test_a_prefix_case_asks_for_no_prompt_logprobs_and_is_judged_by_greedy_only() -> None:
    """vLLM 0.32.0 skips reading the prefix cache for any request with prompt logprobs
    (SamplingParams: skip_reading_prefix_cache), so the prefix case must not ask for them."""
    from deepinfer_sm80.testing.e2e import runner
    from deepinfer_sm80.testing.e2e.compare import compare_case

    main = next(e for e in runner.plan("full", True) if e.name == "main")
    asks = {c["name"]: c["prompt_logprobs"] for c in runner.worker_cases(main)}
    assert asks == {"short": True, "long_chunked": True, "prefix_hit": False, "concurrent": False}
    oracle = _FixedOracle()
    prompt = list(range(1, 20))
    result = compare_case(oracle, {"prompt": prompt, "tokens": [], "prompt_logprobs": None})
    assert not result["nll_compared"] and result["nll_abs_diff"] is None


@pytest.mark.parametrize("kind", ["ci", "full"])
def test_every_pp_cut_runs_with_and_without_dspark_at_both_levels(kind: str) -> None:
    """Issues 29, 37: the CI plan itself runs 4,2 / 1,5 / 1,1,4 (a cut inside a sharing group, a stage
    without an indexer-K cache, Engram layers opening stages), each plain and with DSpark, at both
    levels, held to the single-stage engines' tokens (and DSpark's drafter inputs), with the PP rows
    required; every one but SYNC_ENGINES on the GPU's asynchronous scheduler."""
    from deepinfer_sm80.testing.e2e import engines as engines_
    from deepinfer_sm80.testing.e2e import runner

    engines = {e.name: e for e in runner.plan(kind, engram=True)}
    assert {p for p, _ in runner.PP_LAYOUTS.values()} >= {"1,5", "1,1,4"}
    for name, (partition, _) in runner.PP_LAYOUTS.items():
        for spec in (False, True):
            e = engines[f"{name}_dspark" if spec else name]
            scheduler = {} if e.name in engines_.SYNC_ENGINES else runner.ASYNC
            assert e.env == {"VLLM_PP_LAYER_PARTITION": partition} | scheduler
            assert e.engine["pipeline_parallel_size"] == partition.count(",") + 1
            assert e.levels == runner.LEVELS
            assert ("speculative_config" in e.engine) == spec
            twins = ("main", None, "dspark") if spec else (None, "main", None)
            assert (e.spec_of, e.same_as, e.aux_of) == twins
            dspark_rows = set(runner.DSPARK_PP_ROWS)
            for rows in e.cases[0].rows.values():
                assert set(runner.PP_ROWS) <= set(rows)
                assert dspark_rows <= set(rows) if spec else not dspark_rows & set(rows)
    served = engines["serve_pp3_dspark"]
    assert served.kind == "serve" and "--pipeline-parallel-size" in served.serve_flags
    assert ("tp2_pp2_dspark" in engines) == (kind == "full")
    assert engines_.SYNC_ENGINES <= set(engines) and engines["main"].env == {}  # sync kept where named
    swept = {e.partition for e in engines.values() if e.name.startswith("cut_")}
    every = set(engines_.every_cut(6))
    assert swept == (every - {p for p, _ in runner.PP_LAYOUTS.values()} if kind == "full" else set())


def test_drafter_input_target_counts_every_difference() -> None:
    from deepinfer_sm80.testing.e2e.runner import aux_target

    same = [[0, "a"], [1, "b"]]
    assert aux_target("t", "dspark", same, list(same))["met"]
    moved = aux_target("t", "dspark", [[0, "a"], [1, "c"]], same)
    assert not moved["met"] and moved["measured"] == 1
    assert aux_target("t", "dspark", same[:1], same)["measured"] == 1  # a missing step counts
    assert not aux_target("t", "dspark", [], [])["met"]  # nothing recorded is not a pass
    # the async scheduler's one extra step at a request's end, on either side, and only there
    assert aux_target("t", "dspark", same[:1], same, overshoot=1)["met"]
    assert aux_target("t", "dspark", same, same[:1], overshoot=1)["met"]
    longer = [*same, [2, "c"]]
    assert not aux_target("t", "dspark", [[0, "a"], [1, "x"]], longer, overshoot=1)["met"]
    assert aux_target("t", "dspark", [[0, "a"]], longer, overshoot=1)["measured"] == 2  # two steps short


def test_drafter_inputs_of_the_first_request_end_at_the_next_prefill() -> None:
    from deepinfer_sm80.testing.e2e.runner import _first_request

    aux = [[0, "a"], [1, "b"], [2, "c"], [1, "b2"], [2, "c2"], [0, "z"], [1, "y"]]
    assert _first_request(aux) == aux[:5]
    assert _first_request(aux[:5]) == aux[:5]


def test_pp_groups_leave_the_spinning_shared_memory_channel() -> None:
    """The stand-in sends PP tensors over vLLM's gloo fallback; tensor-parallel groups keep shared memory."""
    from types import SimpleNamespace

    from deepinfer_sm80.testing.e2e.standins import _pp_over_gloo

    class Comm:
        def _all_group_ranks_share_shm_group_name(self) -> bool:
            return True

    class Shm:
        def all_gather_into_tensor(self, output, input, group=None) -> None:
            raise AssertionError("shared-memory all-gather called")

    _pp_over_gloo(SimpleNamespace(CpuCommunicator=Comm, _CPUSHMDistributed=Shm))
    for name, shared in (("pp:0", False), ("tp:1", True)):
        comm = Comm()
        comm.unique_name = name
        assert comm._all_group_ranks_share_shm_group_name() is shared


def test_a_dspark_engine_must_have_its_drafts_accepted() -> None:
    """Issue 37 item 6: drafting alone is not enough; accepted / drafted over the engine's cases must reach
    MIN_ACCEPTANCE, so acceptance, rollback and bonus tokens run (a rejected-only run fails)."""
    from deepinfer_sm80.testing.e2e import runner

    engine = next(e for e in runner.plan("ci", engram=True) if e.name == "pp2_shared_dspark")

    def judged(drafted: float, accepted: float) -> dict:
        spec = {"vllm:spec_decode_num_draft_tokens": drafted}
        spec["vllm:spec_decode_num_accepted_tokens"] = accepted
        out = {"ok": True, "cases": [], "spec_decode": spec}
        targets = runner.engine_targets("optimized", engine, out, None, {})
        return next(t for t in targets if t["name"].endswith("/acceptance_rate"))

    assert judged(24, 9)["met"] and judged(24, 9)["measured"] == 0.375
    assert not judged(9, 0)["met"]  # every draft rejected
    assert not judged(0, 0)["met"] and judged(0, 0)["measured"] is None  # nothing drafted
