"""A small fake vLLM OpenAI server for harness tests, run as a subprocess (`python fakeserver.py`).

It prints its port on stdout once listening. Behaviour is set with POST /fake/config (JSON):
  tokens_per_chunk (int), step_ms, ttft_ms, max_model_len, mode, fail_after_events,
  restart_after_requests, generation_counted, prefix_caching. Modes: normal | error_after_200 |
  truncate | nan_logprobs. A prefix cache of 16-token blocks keyed by cache_salt feeds
  cached_tokens and vllm:prefix_cache_{queries,hits}; /v1/chat/completions renders messages with a
  toy template that marks thinking on (the default) or off; /detokenize writes ids as words.
Metrics mimic vLLM's names (counters with _total and _created), so restart detection works.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

from aiohttp import web

DEFAULT = {
    "tokens_per_chunk": 1,
    "step_ms": 1.0,
    "ttft_ms": 2.0,
    "max_model_len": 1_100_000,
    "mode": "normal",
    "fail_after_events": 2,
    "restart_after_requests": -1,
    "vocab": 1000,
    "generation_counted": 1.0,  # share of generated tokens the fake's counter sees (1: all, like vLLM)
    "prefix_caching": True,  # like vLLM's default; blocks of BLOCK tokens, keyed by cache_salt
}
BLOCK = 16


class State:
    def __init__(self) -> None:
        self.cfg = dict(DEFAULT)
        self.reset_counters()
        self.running = 0

    def reset_counters(self) -> None:
        self.created = time.time()
        self.c = {
            "prompt_tokens": 0,
            "success": 0,
            "generation": 0,
            "drafts": 0,
            "draft_tokens": 0,
            "accepted": 0,
            "requests_seen": 0,
            "per_pos": [0] * 5,
            "cache_queries": 0,
            "cache_hits": 0,
        }
        self.blocks: set[int] = set()  # chained block keys seen (salt first): the prefix cache


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _cached_tokens(st: State, prompt: list[int], salt: str | None) -> int:
    """Whole blocks of this prompt's prefix already seen with the same salt (vLLM chains block
    hashes from the salt, so a different salt never hits); records this prompt's blocks. Each
    block's key hashes the previous key, so a 649K-token prompt costs one pass."""
    st.c["cache_queries"] += len(prompt)
    if not st.cfg["prefix_caching"]:
        return 0
    hit, key, hitting = 0, hash(salt), True
    for start in range(0, len(prompt) - BLOCK + 1, BLOCK):
        key = hash((key, tuple(prompt[start : start + BLOCK])))
        hitting = hitting and key in st.blocks
        hit += BLOCK if hitting else 0
        st.blocks.add(key)
    hit = min(hit, len(prompt) - 1)  # the last token is always computed
    st.c["cache_hits"] += max(hit, 0)
    return max(hit, 0)


def _render_chat(body: dict, vocab: int) -> list[int]:
    """The fake's chat template: a marker for thinking on/off, then the user texts' word ids, so a
    request that leaves `thinking` unset renders differently (V4.1 thinks by default)."""
    kwargs = body.get("chat_template_kwargs") or {}
    marker = [7, 7] if kwargs.get("thinking", True) else [8]
    words = [w for m in body["messages"] for w in str(m["content"]).split()]
    return [1, *marker, *(sum(map(ord, w)) % vocab for w in words), 2]


async def completions(request: web.Request) -> web.StreamResponse:
    st: State = request.app["state"]
    body = await request.json()
    cfg = st.cfg
    chat = request.path.endswith("/chat/completions")
    if chat:
        st.last_chat_kwargs = body.get("chat_template_kwargs")
        body["prompt"] = _render_chat(body, cfg["vocab"])
        body["max_tokens"] = body.get("max_completion_tokens", body.get("max_tokens", 16))
    st.c["requests_seen"] += 1
    if cfg["restart_after_requests"] >= 0 and st.c["requests_seen"] > cfg["restart_after_requests"]:
        st.reset_counters()
        cfg["restart_after_requests"] = -1
    prompt = body["prompt"]
    cached = _cached_tokens(st, prompt, body.get("cache_salt")) if isinstance(prompt, list) else 0
    if not isinstance(prompt, list):
        prompt = [hash(w) % cfg["vocab"] for w in str(prompt).split()]
    max_tokens = min(body.get("max_tokens", 16), cfg["max_model_len"] - len(prompt))  # the silent clamp
    if "prompt_logprobs" in body and not body.get("stream"):
        return _prompt_logprobs(st, prompt, body)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    st.running += 1
    try:
        if chat:  # vLLM's chat stream opens with a role-only chunk, before any token
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            await resp.write(_event({"id": "chatcmpl-x", "choices": [role]}))
        await asyncio.sleep(cfg["ttft_ms"] / 1e3)
        sent, events, k = 0, 0, max(1, int(cfg["tokens_per_chunk"]))
        while sent < max_tokens:
            n = min(k, max_tokens - sent)
            ids = [(sent + j + len(prompt)) % cfg["vocab"] for j in range(n)]
            finish = "length" if sent + n == max_tokens else None
            choice = {
                "index": 0,
                "text": "x" * n,
                "finish_reason": finish,
                "token_ids": ids if body.get("return_token_ids") else None,
            }
            if chat:
                choice["delta"] = {"content": choice.pop("text")}
            if events == 0 and body.get("return_token_ids"):
                choice["prompt_token_ids"] = prompt
            await resp.write(_event({"id": "cmpl-x", "choices": [choice]}))
            sent += n
            events += 1
            st.c["generation"] += n * cfg["generation_counted"]
            if events > 1:  # one speculative step: K=5 drafts, the first n − 1 accepted
                st.c["drafts"] += 1
                st.c["draft_tokens"] += 5
                st.c["accepted"] += n - 1
                for pos in range(min(n - 1, 5)):
                    st.c["per_pos"][pos] += 1
            if cfg["mode"] == "error_after_200" and events == cfg["fail_after_events"]:
                await resp.write(
                    _event(
                        {
                            "error": {
                                "message": "engine failed",
                                "type": "InternalError",
                                "param": None,
                                "code": 500,
                            }
                        }
                    )
                )
                await resp.write(b"data: [DONE]\n\n")
                return resp
            if cfg["mode"] == "truncate" and events == cfg["fail_after_events"]:
                request.transport.close()
                return resp
            await asyncio.sleep(cfg["step_ms"] / 1e3)
        st.c["prompt_tokens"] += len(prompt)
        st.c["success"] += 1
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": sent,
            "total_tokens": len(prompt) + sent,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        steps = events - 1
        spec = {
            "num_spec_steps": steps,
            "num_draft_tokens": 5 * steps,
            "num_accepted_draft_tokens": sent - min(k, sent) - steps,
        }
        metrics = {
            "time_to_first_token_ms": cfg["ttft_ms"],
            "queue_time_ms": 0.01,
            "generation_time_ms": cfg["step_ms"] * events,
            "speculative_decoding": spec,
        }
        await resp.write(
            _event(
                {
                    "id": "cmpl-x",
                    "choices": [],
                    "usage": usage,
                    "system_fingerprint": "vllm-0.32.0-fake0001",
                    "metrics": metrics,
                }
            )
        )
        await resp.write(b"data: [DONE]\n\n")
        return resp
    finally:
        st.running -= 1


def _prompt_logprobs(st: State, prompt: list[int], body: dict) -> web.Response:
    entries: list = [None]
    for i, tok in enumerate(prompt[1:], start=1):
        lp = -9999.0 if st.cfg["mode"] == "nan_logprobs" and i == 2 else -0.5 - (i % 3) * 0.1
        top = {str(tok): {"logprob": lp, "rank": 1 if i % 2 else 2, "decoded_token": "t"}}
        if i % 2 == 0:
            top[str((tok + 1) % st.cfg["vocab"])] = {"logprob": -0.1, "rank": 1, "decoded_token": "u"}
        entries.append(top)
    st.c["prompt_tokens"] += len(prompt)
    st.c["generation"] += st.cfg["generation_counted"]  # max_tokens 1: one generated token
    st.c["success"] += 1
    return web.json_response(
        {
            "id": "cmpl-x",
            "choices": [
                {
                    "index": 0,
                    "text": "x",
                    "token_ids": None,
                    "finish_reason": "length",
                    "prompt_logprobs": entries,
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": 1,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
            "system_fingerprint": "vllm-0.32.0-fake0001",
            "metrics": {"time_to_first_token_ms": 1.0, "queue_time_ms": 0.01},
        }
    )


async def metrics(request: web.Request) -> web.Response:
    st: State = request.app["state"]
    c, t, lab = st.c, st.created, 'engine="0",model_name="fake"'
    lines = []

    def counter(name: str, value: float, extra: str = "") -> None:
        labels = lab + ("," + extra if extra else "")
        lines.append(f"# TYPE vllm:{name} counter")
        lines.append(f"vllm:{name}_total{{{labels}}} {value}")
        lines.append(f"vllm:{name}_created{{{labels}}} {t}")

    counter("prompt_tokens", c["prompt_tokens"])
    lines.append("# TYPE vllm:prompt_tokens_by_source counter")
    sources = (("local_compute", c["prompt_tokens"]), ("local_cache_hit", 0), ("external_kv_transfer", 0))
    for source, v in sources:
        lines.append(f'vllm:prompt_tokens_by_source_total{{{lab},source="{source}"}} {v}')
    counter("prompt_tokens_cached", 0)
    counter("generation_tokens", c["generation"])
    lines.append("# TYPE vllm:request_success counter")
    lines.append(f'vllm:request_success_total{{{lab},finished_reason="length"}} {c["success"]}')
    counter("num_preemptions", 0)
    counter("prefix_cache_queries", c["cache_queries"])
    counter("prefix_cache_hits", c["cache_hits"])
    counter("spec_decode_num_drafts", c["drafts"])
    counter("spec_decode_num_draft_tokens", c["draft_tokens"])
    counter("spec_decode_num_accepted_tokens", c["accepted"])
    lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
    for pos, v in enumerate(c["per_pos"]):
        lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{pos}"}} {v}')
    lines.append("# TYPE vllm:num_requests_running gauge")
    lines.append(f"vllm:num_requests_running{{{lab}}} {st.running}")
    lines.append("# TYPE vllm:num_requests_waiting gauge")
    lines.append(f"vllm:num_requests_waiting{{{lab}}} 0")
    lines.append("# TYPE vllm:cache_config_info gauge")
    lines.append(f'vllm:cache_config_info{{{lab},block_size="16",kv_cache_size_tokens="4096"}} 1.0')
    return web.Response(text="\n".join(lines) + "\n")


async def tokenize(request: web.Request) -> web.Response:
    st: State = request.app["state"]
    body = await request.json()
    if "messages" in body:
        ids = _render_chat(body, st.cfg["vocab"])
        return web.json_response({"count": len(ids), "max_model_len": st.cfg["max_model_len"], "tokens": ids})
    ids = [sum(map(ord, w)) % st.cfg["vocab"] for w in body["prompt"].split()]
    return web.json_response({"count": len(ids), "max_model_len": st.cfg["max_model_len"], "tokens": ids})


async def reset_prefix_cache(request: web.Request) -> web.Response:
    request.app["state"].blocks.clear()
    return web.json_response({"success": True})


async def detokenize(request: web.Request) -> web.Response:
    body = await request.json()
    return web.json_response({"prompt": " ".join(f"w{t}" for t in body["tokens"])})


async def last_chat(request: web.Request) -> web.Response:
    return web.json_response(
        {"chat_template_kwargs": getattr(request.app["state"], "last_chat_kwargs", None)}
    )


async def configure(request: web.Request) -> web.Response:
    st: State = request.app["state"]
    update = await request.json()
    if update.pop("reset", False):
        st.cfg = dict(DEFAULT)
        st.reset_counters()
    st.cfg.update(update)
    return web.json_response(st.cfg)


def app() -> web.Application:
    application = web.Application(client_max_size=64 * 1024 * 1024)
    application["state"] = State()
    application.router.add_post("/v1/completions", completions)
    application.router.add_get("/metrics", metrics)
    application.router.add_post("/tokenize", tokenize)
    application.router.add_post("/detokenize", detokenize)
    application.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    application.router.add_post("/v1/chat/completions", completions)
    application.router.add_get("/fake/last_chat", last_chat)
    application.router.add_post("/fake/config", configure)
    application.router.add_get("/health", lambda _r: _ok(web.Response()))
    application.router.add_get("/version", lambda _r: _ok(web.json_response({"version": "0.32.0"})))
    application.router.add_get("/v1/models", lambda _r: _ok(web.json_response({"data": [{"id": "fake"}]})))
    info = {
        "vllm_config": {"model": "fake", "instance_id": "random"},
        "vllm_env": {"VLLM_SERVER_DEV_MODE": "1"},
        "system_env": {
            "pip_packages": "torch==2.13.0\nvllm-cpu==0.32.0\nnumpy==2.0",
            "nvidia_driver_version": None,
        },
    }
    application.router.add_get("/server_info", lambda _r: _ok(web.json_response(info)))
    return application


async def _ok(resp: web.Response) -> web.Response:
    return resp


async def main() -> None:
    runner = web.AppRunner(app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    print(port, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    os.nice(10)  # the client under test, not this fake, gets the CPU when both want it
    if os.environ.get("FAKE_SPAWN_CHILD"):  # like vLLM's engine core: a child in the same group
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    asyncio.run(main())
