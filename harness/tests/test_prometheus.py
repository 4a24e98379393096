from deepinfer_harness.prometheus import delta, parse_metrics, restart_evidence

TEXT = """# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0
vllm:prompt_tokens_created{engine="0",model_name="m"} 1700000000.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 50.0
vllm:prompt_tokens_created{engine="1",model_name="m"} 1700000000.0
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 3.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 1.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="64",engine="0",kv_cache_size_tokens="4648480"} 1.0
"""


def test_sums_over_engine_and_skips_created():
    snap = parse_metrics(TEXT)
    assert snap.get("vllm:prompt_tokens_total") == 150.0
    assert snap.total("vllm:request_success_total") == 4.0
    assert snap.total("vllm:request_success_total", finished_reason="length") == 3.0
    assert not any("_created" in k for k in snap.values)
    assert snap.info["vllm:cache_config_info"]["kv_cache_size_tokens"] == "4648480"


def test_delta_and_restart_evidence():
    before = parse_metrics(TEXT)
    after = parse_metrics(TEXT.replace("100.0", "160.0"))
    assert delta(before, after)["vllm:prompt_tokens_total"] == 60.0
    assert restart_evidence(before, after) == []
    restarted = parse_metrics(TEXT.replace("100.0", "5.0").replace("1700000000.0", "1700000500.0"))
    evidence = restart_evidence(before, restarted)
    assert any("changed" in e for e in evidence) and any("went down" in e for e in evidence)
