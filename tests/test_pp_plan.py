"""Replication plan vs hand-computed needs and byte counts (docs/PIPELINE.md §2 works them out).

Per-token wire rows: compressed-KV record 584 B, indexer-K record 132 B (128 e4m3 + fp32), top-k row
512 × 4 = 2048 B, candidate row 2048 × 4 = 8192 B, the step's token id 4 B (to a later stage holding
Engram layer 1 or 14; tests/test_pp_engram.py). Upstream's own IntermediateTensors per token:
hidden_states 4 × 5120 × 2 = 40960 B + pre_mix 4 × 4 = 16 B. Replica KV per context token (128-token
blocks, pages rounded to 576 B): ratio 1 compressed 74880/128 = 585, ratio 2 37440/128 = 292.5;
indexer K ratio 1 17280/128 = 135, ratio 2 8640/128 = 67.5.
"""

from __future__ import annotations

import json

import pytest

from deepinfer_sm80.integration.pp import plan as P
from deepinfer_sm80.integration.pp.topology import Topology, v41_flash_fields

TOPO = Topology.from_config(v41_flash_fields())


def keys(items: tuple[P.Item, ...]) -> set[str]:
    return {i.key for i in items}


def test_topology_reads() -> None:
    assert TOPO.reads(1) == []  # SWA-only
    assert TOPO.reads(2) == []  # kv + index source
    assert TOPO.reads(5) == [("ckv", 2), ("topk", 2)]
    assert TOPO.reads(20) == []  # candidate source owns everything it reads
    assert TOPO.reads(23) == [("ckv", 20), ("topk", 20)]
    assert TOPO.reads(28) == [("ckv", 20), ("ikv", 20), ("cand", 20)]
    assert TOPO.reads(31) == [("ckv", 20), ("topk", 28)]


def test_14_14_12() -> None:
    plan = P.build_plan(TOPO, (14, 14, 12))
    s0, s1, s2 = plan.stages
    assert s0.needs == () and keys(s1.needs) == {"pp_ids_0"}  # Engram layer 14 opens stage 1
    assert keys(s2.needs) == {"pp_ckv_20", "pp_ikv_20", "pp_cand_20"}
    assert keys(s1.sends) == keys(s2.receives) == keys(s2.needs)
    assert plan.payload_bytes_per_token(0) == 4
    assert plan.payload_bytes_per_token(1) == 584 + 132 + 8192 == 8908
    assert plan.replica_kv_bytes_per_token(2) == 585 + 135 == 720
    assert TOPO.hidden_wire_bytes() == 40976


def test_20_20_needs_nothing() -> None:
    plan = P.build_plan(TOPO, (20, 20))
    assert not plan.needs_replication
    assert plan.payload_bytes_per_token(0) == 0 and plan.replica_kv_bytes_per_token(1) == 0
    # stage 1 owns layer 20's caches: 585 + 135 B per context token; stage 0 owns 2, 8, 14 (ratio 2)
    assert plan.own_kv_bytes_per_token(1) == 720
    assert plan.own_kv_bytes_per_token(0) == 3 * (292.5 + 67.5)


def test_13_14_13_default_split_ships_at_both_boundaries() -> None:
    assert P.default_partition(40, 3) == (13, 14, 13)
    plan = P.build_plan(TOPO, P.parse_partition(None, 40, 3, TOPO))
    _, s1, s2 = plan.stages
    assert keys(s1.needs) == {"pp_ckv_8", "pp_topk_8", "pp_ids_0"}  # 13 reads 8's cache, top-k; 14: Engram
    assert keys(s2.needs) == {"pp_ckv_20", "pp_ikv_20", "pp_topk_24", "pp_cand_20"}  # 27 reads 24's top-k
    assert plan.payload_bytes_per_token(0) == 584 + 2048 + 4 == 2636
    assert plan.payload_bytes_per_token(1) == 584 + 132 + 2048 + 8192 == 10956
    assert plan.replica_kv_bytes_per_token(1) == 292.5
    assert plan.replica_kv_bytes_per_token(2) == 720


def test_8_12_20_is_replication_free() -> None:
    plan = P.build_plan(TOPO, (8, 12, 20))
    assert not plan.needs_replication
    assert keys(plan.stages[1].needs) == {"pp_ids_0"}  # Engram layer 14: the step's ids only, 4 B/token
    assert [plan.payload_bytes_per_token(r) for r in range(2)] == [4, 0]


def test_relay_through_a_middle_stage() -> None:
    """21..25 in the middle: layer 20's records reach stage 2 through stage 1 (which also keeps replicas)."""
    plan = P.build_plan(TOPO, (21, 5, 14))
    s1, s2 = plan.stages[1], plan.stages[2]
    assert keys(s1.needs) == {"pp_ckv_20", "pp_ikv_20", "pp_topk_20", "pp_cand_20"}  # 1 and 14 on stage 0
    assert {"pp_ckv_20", "pp_ikv_20", "pp_cand_20"} <= keys(s1.sends) & keys(s1.receives)  # relayed
    assert "pp_topk_24" in keys(s1.sends)  # produced on stage 1 for layers 26-27
    assert keys(s2.needs) == {"pp_ckv_20", "pp_ikv_20", "pp_topk_24", "pp_cand_20"}


def test_legal_cuts_and_alternatives() -> None:
    assert P.legal_cuts(TOPO) == [1, 2, 8, 14, 20]
    assert P.replication_free_partitions(TOPO, 2)[0] == (20, 20)
    assert P.replication_free_partitions(TOPO, 3)[0] == (8, 12, 20)


@pytest.mark.parametrize(
    ("text", "pp", "fragment"),
    [
        ("14,14,13", 3, "sums to 41"),
        ("20,20", 3, "has 2 entries"),
        ("40,0", 2, "empty stage"),
        ("a,b", 2, "not a comma-separated"),
    ],
)
def test_malformed_partition_refused_with_alternatives(text: str, pp: int, fragment: str) -> None:
    with pytest.raises(P.PartitionError) as err:
        P.parse_partition(text, 40, pp, TOPO)
    msg = str(err.value)
    assert fragment in msg and "\n" not in msg
    if "not a comma" not in fragment:
        assert "legal:" in msg and P.default_partition(40, pp) and "," in msg


def test_replication_off_refuses_with_replication_free_alternatives() -> None:
    with pytest.raises(P.PartitionError) as err:
        P.plan_from_env(TOPO, 3, {P.ENV_PARTITION: "14,14,12", P.ENV_REPLICATION: "0"})
    assert "8,12,20" in str(err.value) and "pp_ckv_20" in str(err.value)
    assert P.plan_from_env(TOPO, 2, {P.ENV_PARTITION: "20,20", P.ENV_REPLICATION: "0"}).partition == (20, 20)


def test_cli(tmp_path, capsys) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"text_config": v41_flash_fields()}))
    assert P.main(["--config", str(tmp_path), "--partition", "14,14,12", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stages"][1]["payload_bytes_per_token_out"] == 8908
    assert P.main(["--config", str(tmp_path), "--partition", "14,14,11"]) == 2
    assert "sums to 39" in capsys.readouterr().err
