"""Issue 42's "Also" list: the config schema as pydantic v2 models, vLLM's conventions, the sweep
anchored as GuideLLM anchors it, the dry-run header, charts."""

from __future__ import annotations

import math
import types
import typing
from pathlib import Path

import pytest
from pydantic import AllowInfNan, BaseModel

from deepinfer_harness import config
from deepinfer_harness.config import ConfigError, Profile, Validity, load_profile, profile_dict
from deepinfer_harness.parity import normalize_args
from deepinfer_harness.run.launch import build_launch
from deepinfer_harness.run.preflight import applicable_checks, preflight_header


def _sections(
    cls: type[BaseModel] = Profile, prefix: str = ""
) -> typing.Iterator[tuple[str, type[BaseModel]]]:
    yield prefix, cls
    for name, info in cls.model_fields.items():
        hint = info.annotation
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            yield from _sections(hint, f"{prefix}{name}.")


def _finite_fields() -> list[str]:
    """Every schema field typed as a finite number (Float, or Float | None)."""
    out = []
    for prefix, cls in _sections():
        for name, info in cls.model_fields.items():
            scalar = info.annotation is float and AllowInfNan(False) in info.metadata
            if scalar or (
                typing.get_origin(info.annotation) in (types.UnionType, typing.Union)
                and config.Float in typing.get_args(info.annotation)
            ):
                out.append(f"{prefix}{name}")
    return out


def test_every_profile_section_is_a_pydantic_model_that_forbids_unknown_keys():
    sections = dict(_sections())
    assert {"", "topology.", "server.", "plan.", "plan.rate.", "plan.rate.sweep.", "ab.", "validity."} <= set(
        sections
    )
    for prefix, cls in sections.items():
        assert cls.model_config.get("extra") == "forbid", prefix


def test_every_finite_number_field_refuses_infinity_and_nan_in_one_line():
    fields = _finite_fields()
    assert {
        "plan.decode.window_s",
        "server.health_timeout_s",
        "read_timeout_s",
        "validity.loop_lag_share",
    } <= set(fields)
    for name in fields:
        for raw, shown in ((".inf", "inf"), (".nan", "nan")):
            with pytest.raises(ConfigError) as err:
                load_profile("smoke", [f"{name}={raw}"])
            assert f"{name} = {shown}: must be finite" in str(err.value), str(err.value)
    assert load_profile("smoke", ["plan.rate.rates=[.inf]"]).plan.rate.rates == [math.inf]  # all at once


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("plan.ttft_n=true", "plan.ttft_n = True: expected integer"),
        ("plan.ttft_n='5'", "plan.ttft_n = '5': expected integer"),
        ("plan.rate.isl=3.5", "plan.rate.isl = 3.5: expected integer or a mapping of string to number"),
        (
            "topology.pp_partition=[1, x]",
            "topology.pp_partition = [1, 'x']: expected a list of integer or null",
        ),
        ("plan.prefill.concurrent=[{isl: 64, c: x}]", "plan.prefill.concurrent[0].c = 'x': expected integer"),
        (
            "plan.rate={ramps: [{strategy: linear, start_rps: 1}]}",
            "plan.rate.ramps[0]: missing required ['end_rps']",
        ),
        (
            "plan.rate={ramps: [{strategy: linear, start_rps: 1, end: 4}]}",
            "plan.rate.ramps[0]: unknown keys ['end']",
        ),
        (
            "plan.rate.sweep={points: 2, knee: 1}",
            "plan.rate.sweep: unknown keys ['knee']; allowed ['points']",
        ),
        ("validity.loop_lag_share=x", "validity.loop_lag_share = 'x': expected number or null"),
    ],
)
def test_pydantic_errors_read_as_the_schema_one_line(override, needle):
    with pytest.raises(ConfigError) as err:
        load_profile("smoke", [override])
    assert str(err.value) == f"profile smoke: {needle}" or needle in str(err.value), str(err.value)
    assert "\n" not in str(err.value) and "pydantic" not in str(err.value)


def test_a_section_built_directly_raises_config_error_naming_its_field():
    with pytest.raises(ConfigError, match=r"validity.loop_lag_share = 0.0: must be > 0"):
        Validity(loop_lag_share=0)
    with pytest.raises(ConfigError, match=r"loop_lag_share = inf: must be finite"):
        Validity(loop_lag_share=math.inf)


@pytest.mark.parametrize("name", ["smoke", "tiny-v41", "a100x8-tp8", "ga100x6-tp2pp3"])
def test_profile_dict_round_trips_through_the_schema(name):
    """What the manifest records (profile_dict) validates back to the same profile, types included."""
    stored = profile_dict(load_profile(name))
    again = profile_dict(Profile.model_validate(stored))
    assert again == stored
    assert repr(again) == repr(stored)  # 1 vs 1.0 would differ here


# --- vLLM's conventions ---------------------------------------------------------------------------


def test_vllm_serve_takes_the_model_positional_and_a_module_entry_keeps_the_flag():
    """`vllm serve MODEL` (vLLM 0.32.0 deprecates `--model`); `python -m vllm.entrypoints.openai.
    api_server` never copies its positional into the model, so there it stays `--model`."""
    docker = build_launch(load_profile("ga100x8-tp4pp2"), "B", "/models/v41", "run1", 2)
    at = docker.argv.index("serve")
    assert docker.argv[at + 1] == "/models/v41" and "--model" not in docker.argv
    assert docker.serve_args[0] == "/models/v41"
    cli = load_profile("smoke", ["server.command=['{python}', -m, vllm.entrypoints.cli.main, serve]"])
    argv = build_launch(cli, "A", "/tiny", "r", 0).argv
    assert argv[4] == "/tiny" and "--model" not in argv
    module = build_launch(load_profile("smoke"), "A", "/tiny", "r", 0)  # smoke.yaml: the api_server module
    assert module.argv[3:5] == ["--model", "/tiny"]


def test_parity_reads_model_flag_and_positional_as_the_same_command():
    assert normalize_args(["--model", "/m", "--port", "1", "--dtype", "x"]) == normalize_args(
        ["/m", "--port", "2", "--dtype", "x"]
    )
    assert normalize_args(["/m", "--dtype", "x"]) != normalize_args(["/n", "--dtype", "x"])


def test_docker_gpus_is_a_profile_field():
    assert "--gpus all" in " ".join(build_launch(load_profile("ga100x8-tp4pp2"), "A", "/m", "r", 0).argv)
    listed = load_profile("ga100x8-tp4pp2", ["server.gpus=[0, 1, 2, 3, 4, 5, 6, 7]"])
    argv = build_launch(listed, "A", "/m", "r", 0).argv
    assert argv[argv.index("--gpus") + 1] == '"device=0,1,2,3,4,5,6,7"'
    counted = load_profile("ga100x8-tp4pp2", ["server.gpus=8"])
    argv = build_launch(counted, "A", "/m", "r", 0).argv
    assert argv[argv.index("--gpus") + 1] == "8"
    for value, needle in [
        ("[0, 1, 2, 3]", "server.gpus = [0, 1, 2, 3]: TP4 x PP2 on 1 node(s) needs 8 GPUs per node"),
        ("[0, 0, 1, 2, 3, 4, 5, 6]", "server.gpus = [0, 0, 1, 2, 3, 4, 5, 6]: must not repeat"),
        ("some", "server.gpus = 'some': allowed all, a count >= 1, or a list of device indices"),
        ("0", "server.gpus = '0': allowed all, a count >= 1"),
    ]:
        with pytest.raises(ConfigError) as err:
            load_profile("ga100x8-tp4pp2", [f"server.gpus={value}"])
        assert needle in str(err.value), str(err.value)


def test_numpy_and_pydantic_are_declared_dependencies():
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    deps = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert '"numpy>=' in deps and '"pydantic>=2' in deps


# --- the dry-run header ---------------------------------------------------------------------------


def test_the_dry_run_header_names_only_the_checks_that_applied(tmp_path):
    local = load_profile("smoke")
    assert preflight_header(local, tmp_path, frozenset()) == (
        "# preflight passed (output, model, command, ports, host-memory, corpus)"
    )
    assert preflight_header(local, tmp_path, frozenset({"model", "docker", "urls"})) == (
        "# preflight passed (output, command, ports, host-memory, corpus); skipped: model"
    )
    url = load_profile("smoke", ["server.mode=url", "server.urls={A: 'http://h:1', B: 'http://h:2'}"])
    assert preflight_header(url, tmp_path, frozenset()) == "# preflight passed (output, urls, corpus)"
    docker = load_profile("ga100x8-tp4pp2")
    assert applicable_checks(docker, None) == ["model", "ports", "docker", "host-memory", "corpus"]
