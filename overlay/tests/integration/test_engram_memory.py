"""The Engram host-memory check (integration/engram_memory.py): sizes by hand, fits / does not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepinfer_sm80.integration import engram_memory as em

# two Engram layers, tables of 5,000 and 3,000 rows, 64-wide rows: (64 + 2) bytes per row
CONFIG = {"engram_layer_ids": [1, 14], "engram_num_embeddings": [5000, 3000], "engram_head_dim": 64}
TABLE = (5000 + 3000) * 66


def _meminfo(tmp_path: Path, avail_kib: int) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       99999999 kB\nMemFree:        1 kB\nMemAvailable:   {avail_kib} kB\n")
    return path


def test_table_bytes_by_hand() -> None:
    assert em.engram_table_bytes(CONFIG) == TABLE == 528_000
    assert em.engram_table_bytes({"engram_layer_ids": []}) == 0


@pytest.mark.parametrize(
    ("dp", "shared", "offload", "copies"),
    [(1, False, True, 1), (4, False, True, 4), (4, True, True, 1), (4, False, False, 0)],
)
def test_copies_per_node(tmp_path: Path, dp: int, shared: bool, offload: bool, copies: int) -> None:
    got = em.check_engram_host_memory(
        CONFIG,
        dp_per_node=dp,
        dp_shared_memory=shared,
        cpu_offload=offload,
        meminfo=_meminfo(tmp_path, 10**9),
        memlock=None,
    )
    assert (got.copies, got.need_bytes, got.ok) == (copies, copies * TABLE, True)


def test_does_not_fit_names_the_ways_out(tmp_path: Path) -> None:
    avail_kib = 3 * TABLE // 1024  # room for 2 copies, not 4
    got = em.check_engram_host_memory(
        CONFIG, dp_per_node=4, meminfo=_meminfo(tmp_path, avail_kib), memlock=None
    )
    assert not got.ok and got.available_bytes == avail_kib * 1024
    assert "does not fit" in got.message and "dp_shared_memory" in got.message and "\n" not in got.message
    with pytest.raises(em.EngramMemoryError, match="does not fit"):
        em.preflight_engram_memory(CONFIG, dp_per_node=4, meminfo=_meminfo(tmp_path, avail_kib), memlock=None)
    assert em.preflight_engram_memory(
        CONFIG, dp_per_node=2, meminfo=_meminfo(tmp_path, avail_kib), memlock=None
    ).ok


def test_low_memlock_is_a_note_not_a_refusal(tmp_path: Path) -> None:
    got = em.check_engram_host_memory(CONFIG, meminfo=_meminfo(tmp_path, 10**9), memlock=64 * 1024)
    assert got.ok and "RLIMIT_MEMLOCK" in got.message


def test_unknown_memavailable_is_not_ok(tmp_path: Path) -> None:
    got = em.check_engram_host_memory(CONFIG, meminfo=tmp_path / "absent", memlock=None)
    assert not got.ok and "MemAvailable unknown" in got.message


def test_bad_config_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="engram_num_embeddings"):
        em.engram_table_bytes(
            {"engram_layer_ids": [1, 14], "engram_num_embeddings": [5], "engram_head_dim": 64}
        )
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        em.load_config(tmp_path)


def test_cli(tmp_path: Path, capsys) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    assert em.main([str(tmp_path), "--json"]) in (0, 1)  # this host's MemAvailable decides
    assert json.loads(capsys.readouterr().out)["table_bytes"] == TABLE
    assert em.main([str(tmp_path / "nope.json")]) == 2
