"""One streamed chat completion, timed as a client sees it.

TTFT is the time to the first chunk carrying content; the decode time per output token is (last content chunk −
first) ÷ (output tokens − 1), as `vllm bench serve` computes TPOT. Token counts come from the endpoint's usage
(``stream_options.include_usage``; ``prompt_tokens_details.cached_tokens`` for prefix-cache hits); when an
endpoint sends no usage the output is counted in content chunks and the outcome says so (``usage`` False).
A request is successful only with HTTP 200, a finished stream and at least one output token.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx

from v41flash_bench.serve.workloads import Request


@dataclass
class Outcome:
    script: str
    start: float  # seconds after the point began
    ok: bool = False
    error: str = ""  # "" when ok; "cancelled" when the drain deadline cut it
    ttft: float | None = None
    e2e: float | None = None
    decode_s: float | None = None  # first → last content chunk
    prompt_tokens: int = 0
    cached_tokens: int | None = None  # None: the endpoint did not say
    output_tokens: int = 0
    usage: bool = False

    @property
    def tpot(self) -> float | None:
        if self.decode_s is None or self.output_tokens < 2:
            return None
        return self.decode_s / (self.output_tokens - 1)


def body(model: str, req: Request, ignore_eos: bool) -> dict:
    b = {"model": model, "messages": [{"role": r, "content": c} for r, c in req.messages],
         "max_tokens": req.max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        b["ignore_eos"] = True
    return b


async def send(http: httpx.AsyncClient, url: str, model: str, req: Request, out: Outcome, *, t0: float,
               ignore_eos: bool = False, headers: dict | None = None) -> Outcome:
    """Stream ``req`` to ``url``/v1/chat/completions and fill ``out`` (its start is already set); never raises
    for the endpoint's failures (they are the outcome's error)."""
    hdrs = dict(headers or {})
    if req.session:
        hdrs["x-session-id"] = req.session
    started = t0 + out.start
    first = last = None
    chunks = 0
    try:
        async with http.stream("POST", f"{url}/v1/chat/completions", json=body(model, req, ignore_eos),
                               headers=hdrs) as r:
            if r.status_code != 200:
                text = (await r.aread())[:200].decode(errors="replace")
                out.error = f"HTTP {r.status_code}: {text}"
                return out
            done = False
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                try:
                    msg = json.loads(data)
                except json.JSONDecodeError:
                    out.error = f"bad stream chunk: {data[:80]}"
                    return out
                if msg.get("error"):
                    out.error = f"stream error: {str(msg['error'])[:160]}"
                    return out
                now = time.perf_counter()
                for ch in msg.get("choices") or ():
                    delta = ch.get("delta") or {}
                    if delta.get("content") or delta.get("reasoning_content"):
                        chunks += 1
                        first = first if first is not None else now
                        last = now
                usage = msg.get("usage")
                if usage:
                    out.usage = True
                    out.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    out.output_tokens = int(usage.get("completion_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    if details.get("cached_tokens") is not None:
                        out.cached_tokens = int(details["cached_tokens"])
            if not done:
                out.error = "stream ended without [DONE]"
                return out
    except httpx.HTTPError as exc:
        out.error = f"{exc.__class__.__name__}: {str(exc)[:160]}"
        return out
    end = time.perf_counter()
    if not out.usage:
        out.output_tokens = chunks
    if first is None or out.output_tokens < 1:
        out.error = "no output tokens"
        return out
    out.ok, out.ttft, out.e2e, out.decode_s = True, first - started, end - started, last - first
    return out
