"""The image-smoke JSON's per-stage figures come from BuildKit's own step lines, parsed per build."""

import image_smoke_result as isr

LOG = """\
== 01:00:00 make image VLLM_BUILD=precompiled
#1 [internal] load build definition from Dockerfile.sm80
#1 DONE 0.1s
#5 [base 1/3] FROM deepinfer-local/debian:trixie
#5 DONE 0.0s
#6 [base 2/3] RUN apt-get update
#6 DONE 41.5s
#7 [build 1/2] RUN pip wheel vllm
#7 CACHED
#8 [build 2/2] RUN pip install torch
#8 DONE 113.2s
#1 [internal] load build definition from Dockerfile.sm80
#1 DONE 0.0s
#5 [base 1/3] FROM deepinfer-local/debian:trixie
#5 CACHED
#9 [deepinfer 1/1] RUN python3 -m deepinfer_sm80.selftest
#9 DONE 269.0s
"""


def test_stages_sum_their_steps_and_count_cache_hits_per_build():
    stages = {s["name"]: s for s in isr.parse_buildkit(LOG)}
    assert [n.rsplit(" ", 1)[1] for n in stages] == ["base", "build", "deepinfer"]
    base = stages["docker build stage base"]
    assert base["seconds"] == 41.5 and base["steps_run"] == 2 and base["steps_cached"] == 1  # #5 of build 2
    assert stages["docker build stage build"]["steps_cached"] == 1
    assert stages["docker build stage deepinfer"]["seconds"] == 269.0


def test_no_buildkit_lines_is_a_one_line_error(tmp_path, capsys):
    log = tmp_path / "smoke.log"
    log.write_text("nothing here\n")
    rc = isr.main(["--log", str(log), "--images", "a:b", "--phases", "x=1", "--base-made", "1",
                   "--out", str(tmp_path / "o.json")])  # fmt: skip
    assert rc == 2 and "no BuildKit plain-progress steps" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


def test_a_phase_split_by_a_comma_is_a_one_line_error(tmp_path, capsys):
    log = tmp_path / "smoke.log"
    log.write_text(LOG)
    out = tmp_path / "o.json"
    argv = ["--log", str(log), "--images", "x:baseline", "--base-made", "0", "--out", str(out),
            "--phases", "make image (both targets, wall)=12"]  # fmt: skip
    assert isr.main(argv) == 2
    assert "--phases item" in capsys.readouterr().err and not out.exists()


def test_targets_fail_on_a_failed_phase_or_a_missing_image():
    ok = [{"name": "make image", "seconds": 10.0, "status": "ok"}]
    bad = [*ok, {"name": "harness --dry-run commands", "seconds": 3.0, "status": "failed"}]
    images = [{"tag": "a", "size_bytes": 5}, {"tag": "b", "size_bytes": 6}]
    assert all(t["met"] for t in isr.targets_of(ok, images, 2))
    failed = [t["name"] for t in isr.targets_of(bad, images[:1], 2) if not t["met"]]
    assert failed == ["phase ok: harness --dry-run commands", "images built"]
    assert all(t["direction"] == ">=" for t in isr.targets_of(bad, images, 2))
