"""aiohttp client for /v1/completions: stamp every read, parse afterwards, trust nothing.

The body is encoded before t_send; the stream is read with `iter_any()` into our own SSE splitter
with a 16 MiB read buffer (aiohttp's line reader raises LineTooLong above 2 × read_bufsize); an
HTTP 200 followed by an `error` event, a stream without `[DONE]`, or a missing usage event is an
error on the record, never a silent success.
"""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp

from deepinfer_harness.records import RequestRecord
from deepinfer_harness.run.sse import SSESplitter

READ_BUFSIZE = 16 * 1024 * 1024
_DONE = b"[DONE]"


def make_session(concurrency: int, read_timeout_s: float) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=read_timeout_s)
    connector = aiohttp.TCPConnector(limit=concurrency + 2)
    return aiohttp.ClientSession(timeout=timeout, connector=connector, read_bufsize=READ_BUFSIZE)


def completion_body(
    model: str,
    prompt: list[int],
    max_tokens: int,
    *,
    salt: str,
    request_id: str,
    stream: bool,
    token_ids: bool,
    prompt_logprobs: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        **_pinned(max_tokens, seed, salt, request_id),
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if token_ids:
        body["return_token_ids"] = True
    if prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs
    return body


def _pinned(max_tokens: int, seed: int, salt: str, request_id: str) -> dict[str, Any]:
    """The sampling every request pins: exactly max_tokens greedy tokens, its seed, salt and id."""
    return {
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "seed": seed,
        "cache_salt": salt,
        "request_id": request_id,
    }


def chat_body(
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    *,
    salt: str,
    request_id: str,
    thinking: bool,
    seed: int = 0,
) -> dict[str, Any]:
    """/v1/chat/completions with the same pinned sampling and length as `completion_body`, and
    `chat_template_kwargs.thinking` set explicitly: vLLM 0.32.0's DeepSeek V4.1 tokenizer
    (tokenizers/deepseek_v41.py) renders thinking mode whenever neither `thinking` nor
    `enable_thinking` is in the kwargs, so an unset field would silently measure reasoning."""
    return {
        "model": model,
        "messages": messages,
        "max_completion_tokens": max_tokens,
        **_pinned(max_tokens, seed, salt, request_id),
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "chat_template_kwargs": {"thinking": thinking},
    }


def _apply_event(rec: RequestRecord, obj: dict[str, Any], t_ns: int, want_ids: bool) -> None:
    if obj.get("error"):
        err = obj["error"]
        rec.error = f"error event: {err.get('message', err) if isinstance(err, dict) else err}"
        return
    if obj.get("usage"):
        usage = obj["usage"]
        rec.prompt_tokens = usage.get("prompt_tokens")
        rec.output_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        rec.cached_tokens = details.get("cached_tokens")
        rec.server_metrics = obj.get("metrics")
        rec.system_fingerprint = obj.get("system_fingerprint")
    for choice in obj.get("choices") or []:
        ids = choice.get("token_ids")
        if "delta" in choice and not ids:  # a chat stream's role-only first chunk carries no token
            if choice.get("finish_reason"):
                rec.finish_reason = choice["finish_reason"]
            continue
        rec.event_times_ns.append(t_ns)
        rec.tokens_per_chunk.append(len(ids) if ids is not None else None)
        if want_ids and ids is not None:
            rec.output_token_ids = (rec.output_token_ids or []) + list(ids)
        if choice.get("finish_reason"):
            rec.finish_reason = choice["finish_reason"]


def _finalize(rec: RequestRecord) -> None:
    if rec.error:
        return
    if not rec.done:
        rec.error = "truncated stream: no [DONE]"
    elif rec.output_tokens is None:
        rec.error = "no usage event"
    elif not rec.event_times_ns:
        rec.error = "no content event"


async def stream_completion(
    session: aiohttp.ClientSession,
    base_url: str,
    body: dict[str, Any],
    rec: RequestRecord,
    want_ids: bool = False,
    path: str = "/v1/completions",
) -> RequestRecord:
    """POST a streaming completion (or chat completion, `path`); fills timing and usage on `rec`
    (errors included) and returns it."""
    payload = json.dumps(body, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json", "X-Request-Id": rec.request_id}
    splitter = SSESplitter()
    raw: list[tuple[int, bytes]] = []
    rec.start_time = time.time()
    rec.t_send_ns = time.perf_counter_ns()
    try:
        async with session.post(f"{base_url}{path}", data=payload, headers=headers) as resp:
            rec.http_status = resp.status
            if resp.status != 200:
                rec.error = f"http {resp.status}: {(await resp.text())[:500]}"
            else:
                async for chunk in resp.content.iter_any():
                    t_ns = time.perf_counter_ns()
                    events = splitter.feed(chunk)
                    if events:
                        rec.events_per_read.append(len(events))
                        raw.extend((t_ns, e) for e in events)
                    if events and events[-1] == _DONE:
                        break
                raw.extend((time.perf_counter_ns(), e) for e in splitter.finish())
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
    rec.t_end_ns = time.perf_counter_ns()
    for t_ns, event in raw:
        if event == _DONE:
            rec.done = True
            break
        try:
            _apply_event(rec, json.loads(event), t_ns, want_ids)
        except (json.JSONDecodeError, AttributeError) as exc:
            rec.error = rec.error or f"bad event: {exc}"
    _finalize(rec)
    return rec


def _score_prompt_logprobs(prompt: list[int], entries: list[Any] | None) -> dict[str, Any]:
    """Per position i ≥ 1: logprob of the actual token, the top-1 id (rank 1) and the actual rank."""
    lp: list[float | None] = []
    top1: list[int | None] = []
    rank: list[int | None] = []
    for i, entry in enumerate(entries or []):
        if i == 0:
            continue
        actual = entry.get(str(prompt[i])) if isinstance(entry, dict) else None
        lp.append(actual["logprob"] if actual else None)
        rank.append(actual.get("rank") if actual else None)
        best = [int(k) for k, v in (entry or {}).items() if isinstance(v, dict) and v.get("rank") == 1]
        top1.append(best[0] if best else None)
    return {"n": len(entries or []), "lp": lp, "top1": top1, "rank": rank}


async def prompt_logprobs(
    session: aiohttp.ClientSession, base_url: str, body: dict[str, Any], rec: RequestRecord
) -> RequestRecord:
    """Non-streaming prompt-logprob request; stores the scored positions on `rec.prompt_logprobs`."""
    payload = json.dumps(body, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json", "X-Request-Id": rec.request_id}
    rec.start_time = time.time()
    rec.t_send_ns = time.perf_counter_ns()
    try:
        async with session.post(f"{base_url}/v1/completions", data=payload, headers=headers) as resp:
            rec.http_status = resp.status
            text = await resp.read()
        rec.t_end_ns = time.perf_counter_ns()
        rec.event_times_ns = [rec.t_end_ns]
        obj = json.loads(text)
        if resp.status != 200 or obj.get("error"):
            rec.error = f"http {resp.status}: {str(obj.get('error', obj))[:500]}"
            return rec
        choice = obj["choices"][0]
        usage = obj.get("usage") or {}
        rec.done, rec.finish_reason = True, choice.get("finish_reason")
        rec.prompt_tokens, rec.output_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
        rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        rec.server_metrics, rec.system_fingerprint = obj.get("metrics"), obj.get("system_fingerprint")
        rec.prompt_logprobs = _score_prompt_logprobs(body["prompt"], choice.get("prompt_logprobs"))
    except (aiohttp.ClientError, TimeoutError, OSError, json.JSONDecodeError, KeyError, IndexError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
        rec.t_end_ns = rec.t_end_ns or time.perf_counter_ns()
    return rec


async def get_json(
    session: aiohttp.ClientSession, url: str, method: str = "GET", body: dict[str, Any] | None = None
) -> Any:
    async with session.request(method, url, json=body) as resp:
        resp.raise_for_status()
        return await resp.json(content_type=None)


async def get_text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as resp:
        resp.raise_for_status()
        return await resp.text()
