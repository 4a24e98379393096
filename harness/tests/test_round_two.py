"""Issue 23 defects 2 and 3, issue 20 items 4 and 6: every bad input is one line and exit 2 before
anything starts; `make bench-ab` keeps the harness's exit status; the tiny V4.1 A/B (mode level)
composes the patched CPU tree's launch from the e2e API."""

import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from deepinfer_harness.cli import main
from deepinfer_harness.config import ConfigError, load_profile

from .conftest import write_checkpoint

ROOT = Path(__file__).resolve().parents[2]
NO_PORTS = ["--skip-check", "ports"]  # the profiles' fixed ports may be taken on a shared host


def one_line_exit_2(argv, capsys, needle):
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and needle in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        (
            "plan.decode.concurrencies=[0, 2]",
            "plan.decode.concurrencies = [0, 2]: every entry must be an integer >= 1",
        ),
        ("plan.decode.concurrencies=[-1]", "every entry must be an integer >= 1"),
        ("plan.prefill.n=0", "plan.prefill.n = 0: must be >= 1"),
        ("plan.ttft_n=0", "plan.ttft_n = 0: must be >= 1"),
        ("plan.decode.window_s=-5", "plan.decode.window_s = -5.0: must be > 0 seconds"),
        ("plan.greedy.n=0", "plan.greedy.n = 0: must be >= 1"),
        ("plan.nll=[{isl: 64}]", "missing ['docs']"),
        (
            "plan.prefill.concurrent=[{isl: 64, c: 0}]",
            "plan.prefill.concurrent[].c = 0: must be an integer >= 1",
        ),
        ("server.mode=dockr", "server.mode = 'dockr': allowed ['local', 'docker', 'url', 'level']"),
        ("server.ports.A=70000", "server.ports.A = 70000: must be a TCP port 1..65535"),
        ("plan.decode.window_s=[1,", "--set plan.decode.window_s: not valid YAML at line 1"),
        ("plan.decode.window_s=soon", "plan.decode.window_s = 'soon': expected number"),
        ("ab.aa=maybe", "ab.aa = 'maybe': expected true/false"),
        ("plan.decode=3", "plan.decode: expected a mapping for DecodePlan, got 3"),
        ("plan.decode.windw_s=1", "unknown keys ['windw_s']"),
        ("ab.numerics.nll=0.1", "ab.numerics.nll = 0.1: unknown tolerance"),
        ("=1", "--set '=1': expected key=value"),
    ],
)
def test_every_bad_profile_field_is_one_line_naming_it(capsys, tmp_path, override, needle):
    argv = ["bench-ab", "--profile", "smoke", "--results", str(tmp_path), "--set", override, *NO_PORTS]
    one_line_exit_2(argv, capsys, needle)
    one_line_exit_2([*argv, "--dry-run"], capsys, needle)
    assert not list(tmp_path.iterdir())  # nothing written


def test_malformed_profile_yaml_is_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nplan:\n  decode: {isl: 64, osl: [\n")
    one_line_exit_2(
        ["bench-ab", "--profile", str(bad), "--results", str(tmp_path)], capsys, "not valid YAML at line"
    )
    one_line_exit_2(["validate", "--profile", str(bad)], capsys, "not valid YAML")
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    one_line_exit_2(["validate", "--profile", str(listed)], capsys, "the top level must be a mapping")
    one_line_exit_2(["validate", "--profile", str(tmp_path / "none.yaml")], capsys, "does not exist")


@pytest.mark.skipif(
    not Path("/sys/kernel").is_dir(), reason="needs Linux sysfs (refuses new files, root too)"
)
def test_a_non_writable_output_directory_is_refused_before_the_run_starts(capsys):
    argv = ["bench-ab", "--profile", "smoke", "--results", "/sys/kernel/deepinfer-results"]
    one_line_exit_2([*argv, "--dry-run"], capsys, "/sys/kernel is not writable")
    one_line_exit_2(argv, capsys, "/sys/kernel is not writable")  # before "run … starts", nothing built


def test_output_that_is_a_file_is_refused(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    argv = ["bench-ab", "--profile", "smoke", "--results", str(tmp_path / "file" / "r"), "--dry-run"]
    one_line_exit_2(argv, capsys, "is not a directory")


def test_a_relative_typo_is_a_path_not_a_hub_id(capsys, tmp_path, monkeypatch):
    """`MODEL=models/typo`: refused in preflight (and in a dry run), not after a server start."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    (tmp_path / "models").mkdir()
    base = ["bench-ab", "--profile", "smoke", "--results", str(tmp_path / "r"), "--dry-run", *NO_PORTS]
    one_line_exit_2([*base, "--model", "models/typo"], capsys, "model path models/typo does not exist")
    one_line_exit_2([*base, "--model", "org/not-downloaded"], capsys, "not in the Hugging Face cache")
    one_line_exit_2([*base, "--model", "a/b/c"], capsys, "model path a/b/c does not exist")
    snap = tmp_path / "hf" / "hub" / "models--org--cached" / "snapshots"
    snap.mkdir(parents=True)
    assert main([*base, "--model", "org/cached"]) == 0  # a downloaded hub id is left to the server


def test_checkpoint_problems_are_one_line_before_any_engine(capsys, tmp_path):
    """Issue 20 item 6: no config.json, a non-V4.1 model type, a vocabulary the harness cannot
    tokenize (a broken tokenizer, ids outside the embedding table) → one line, exit 2."""
    base = ["bench-ab", "--profile", "tiny-v41", "--results", str(tmp_path / "r"), "--dry-run", *NO_PORTS]
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_exit_2([*base, "--model", str(empty)], capsys, "has no config.json")
    llama = write_checkpoint(tmp_path / "llama")
    one_line_exit_2([*base, "--model", llama], capsys, "model_type 'llama' is not what this profile serves")
    small = write_checkpoint(tmp_path / "small", model_type="deepseek_v41", vocab_size=8)
    one_line_exit_2([*base, "--model", small], capsys, "vocab_size 8: the vocabulary does not fit the model")
    broken = write_checkpoint(tmp_path / "broken", model_type="deepseek_v41", tokenizer=False)
    (Path(broken) / "tokenizer.json").write_text('{"model": {"type": "nothing"}}')
    one_line_exit_2([*base, "--model", broken], capsys, "tokenizer.json does not load")
    bad_json = write_checkpoint(tmp_path / "badjson", model_type="deepseek_v41")
    (Path(bad_json) / "config.json").write_text("{model_type: v41")
    one_line_exit_2([*base, "--model", bad_json], capsys, "config.json is not valid JSON")


def fake_e2e(monkeypatch, tmp_path, args=None):
    """Stand-in for deepinfer_sm80.testing.e2e (H1's API): records the levels it prepared."""
    module = types.ModuleType("deepinfer_sm80.testing.e2e")
    prepared = []

    def server_env(level, work=None):
        prepared.append(level)
        return {
            "PYTHONPATH": f"{tmp_path}/{level}/site",
            "TRITON_INTERPRET": "1",
            "VLLM_TARGET_DEVICE": "cpu",
        }

    module.server_env = server_env
    module.serve_args = lambda: list(
        args
        or [
            "--dtype",
            "bfloat16",
            "--kv-cache-dtype",
            "fp8_ds_mla",
            "--max-model-len",
            "1024",
            "--max-num-seqs",
            "1",
        ]
    )
    monkeypatch.setitem(sys.modules, "deepinfer_sm80.testing.e2e", module)
    from deepinfer_harness.run import launch

    launch.level_env.cache_clear()
    return prepared


def test_tiny_v41_profile_launches_each_arm_on_its_patched_level(monkeypatch, tmp_path):
    from deepinfer_harness.manifest import declared_env
    from deepinfer_harness.run.launch import build_launch

    prepared = fake_e2e(monkeypatch, tmp_path)
    profile = load_profile("tiny-v41")
    a, b = (build_launch(profile, v, ".cache/tiny-v41", "r", 0) for v in "AB")
    assert prepared == ["base", "optimized"]
    assert a.env["PYTHONPATH"].endswith("base/site") and b.env["PYTHONPATH"].endswith("optimized/site")
    assert a.env["TRITON_INTERPRET"] == "1" and a.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert a.argv.count("--max-model-len") == 1 and a.argv.count("--dtype") == 1  # no duplicate flags
    assert "--max-num-seqs" in a.argv and a.argv[a.argv.index("--kv-cache-dtype") + 1] == "fp8_ds_mla"
    assert a.arm_facts() == {"level": "base", "patches": "00"} and b.arm_facts()["patches"] == "00+01"
    assert a.identity() != b.identity()  # A/B: the patched trees differ
    assert declared_env(profile) == {"PYTHONPATH"}  # allowed to differ; everything else compared
    with pytest.raises(ConfigError, match="max_model_len = '2048': the CPU engine serves"):
        build_launch(load_profile("tiny-v41", ["max_model_len=2048"]), "A", "m", "r", 0)


def test_a_level_profile_s_own_serve_flag_is_not_overridden_by_the_engine_s_default(monkeypatch, tmp_path):
    """serve_args() ends the command line, so its --max-num-seqs 1 would win over the profile's."""
    from deepinfer_harness.run.launch import build_launch

    fake_e2e(monkeypatch, tmp_path)
    profile = load_profile("tiny-v41", ["serve_flags=[--max-num-seqs, '4']"])
    argv = build_launch(profile, "A", ".cache/tiny-v41", "r", 0).argv
    assert argv.count("--max-num-seqs") == 1 and argv[argv.index("--max-num-seqs") + 1] == "4"
    plain = build_launch(load_profile("tiny-v41"), "A", ".cache/tiny-v41", "r", 0).argv
    assert plain[plain.index("--max-num-seqs") + 1] == "1"  # no profile flag: the engine's own


def test_level_mode_without_the_overlay_is_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "deepinfer_sm80.testing.e2e", None)  # import fails
    from deepinfer_harness.run import launch

    launch.level_env.cache_clear()
    model = write_checkpoint(tmp_path / "v41", model_type="deepseek_v41")
    argv = ["bench-ab", "--model", model, "--results", str(tmp_path / "r"), "--dry-run", *NO_PORTS]
    one_line_exit_2(argv, capsys, "server.mode level needs deepinfer_sm80.testing.e2e")


def test_default_bench_ab_is_the_tiny_v41_ab(monkeypatch, capsys, tmp_path):
    """`bench-ab` with no profile and no model: tiny V4.1, A base vs B DeepInfer (issue 20 item 4)."""
    fake_e2e(monkeypatch, tmp_path)
    model = write_checkpoint(tmp_path / "v41", model_type="deepseek_v41")
    monkeypatch.setattr("deepinfer_harness.cli.TINY_V41_DIR", Path(model))
    monkeypatch.setitem(
        __import__("deepinfer_harness.cli", fromlist=["BUILT_MODELS"]).BUILT_MODELS,
        "tiny-v41",
        (Path(model), "note", "run make tiny-model"),
    )
    argv = ["bench-ab", "--results", str(tmp_path / "r"), "--dry-run", *NO_PORTS]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "# run tiny-v41-" in out and "# A/B;" in out
    assert out.count("client: nll-i32") == 4 and out.count("client: greedy-i16-o4-c1") == 4
    assert "base/site" in out and "optimized/site" in out


def test_default_profile_without_the_checkpoint_names_the_make_target(monkeypatch, capsys, tmp_path):
    from deepinfer_harness import cli

    monkeypatch.setitem(cli.BUILT_MODELS, "tiny-v41", (tmp_path / "absent", "n", "run make tiny-model"))
    one_line_exit_2(
        ["bench-ab", "--results", str(tmp_path / "r")], capsys, "is not built: run make tiny-model"
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
@pytest.mark.parametrize("code", [3, 4])
def test_make_bench_ab_reports_the_harness_exit_status(tmp_path, code):
    """Issue 23 defect 3: make itself can only exit 2 on a failed recipe; the harness's code is
    printed on the last line and kept in <results>/.exit-status."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    stub = venv / "bin" / "python"
    stub.write_text(f'#!/bin/sh\necho harness ran "$@" >&2\nexit {code}\n')
    stub.chmod(0o755)
    (venv / ".stamp").write_text("")
    os.utime(venv / ".stamp", (2**31, 2**31))  # newer than every prerequisite: setup is a no-op
    results = tmp_path / "results"
    proc = subprocess.run(
        ["make", "-s", "--no-print-directory", "bench-ab", f"VENV={venv}", f"BENCH_RESULTS={results}",
         "MODEL=/m", "PROFILE=smoke"],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "MAKEFLAGS": ""},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr  # GNU make's one failure code
    assert f"make bench-ab: harness exit status {code}" in proc.stderr.strip().splitlines()[-2], proc.stderr
    assert (results / ".exit-status").read_text().strip() == str(code)
    assert "--results " + str(results) in proc.stderr


def test_profiles_pass_the_schema():
    for path in sorted((ROOT / "harness" / "profiles").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        assert data["name"] == path.stem
        load_profile(path.stem)


def test_engram_host_memory_shortfall_is_one_line_before_any_engine(monkeypatch, capsys, tmp_path):
    """Issue 22 item 6 through H3's module (a stand-in here): a shortfall refuses the run, the
    server's own --engram-config decides what is pinned."""
    module = types.ModuleType("deepinfer_sm80.integration.engram_memory")
    seen = {}

    class EngramMemoryError(RuntimeError):
        pass

    def preflight_engram_memory(config, **kwargs):
        seen.update(kwargs, layers=config.get("engram_layer_ids"))
        if kwargs["cpu_offload"]:
            raise EngramMemoryError(
                "Engram tables (layers [1, 14]): 1 x 9.0 GiB = 9.0 GiB pinned host memory, 2.0 GiB available"
            )
        return types.SimpleNamespace(
            message="Engram host memory: cpu_offload off: the tables are in GPU memory"
        )

    module.EngramMemoryError, module.preflight_engram_memory = EngramMemoryError, preflight_engram_memory
    monkeypatch.setitem(sys.modules, "deepinfer_sm80.integration.engram_memory", module)
    model = write_checkpoint(tmp_path / "v41", model_type="deepseek_v41")
    cfg = Path(model) / "config.json"
    cfg.write_text(cfg.read_text()[:-1] + ', "text_config": {"engram_layer_ids": [1, 14]}}')
    base = ["bench-ab", "--profile", "smoke", "--model", model, "--results", str(tmp_path / "r"), "--dry-run"]
    base += NO_PORTS
    one_line_exit_2(base, capsys, "9.0 GiB pinned host memory, 2.0 GiB available")
    assert seen["layers"] == [1, 14] and seen["dp_per_node"] == 1  # nested text_config read
    flags = 'serve_flags=[--enforce-eager, --engram-config, "{\\"cpu_offload\\": false}"]'
    assert main([*base, "--set", flags]) == 0
    assert "# Engram host memory: cpu_offload off" in capsys.readouterr().out
    assert main([*base, "--skip-check", "host-memory"]) == 0
