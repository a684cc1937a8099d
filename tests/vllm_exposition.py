"""Builds /metrics pages the way vLLM 0.33.0 exposes them (prometheus_client text format), for tests."""
from __future__ import annotations

TTFT_LE = (0.1, 0.5, 1.0, 2.5, 5.0)
E2E_LE = (1.0, 5.0, 10.0, 30.0, 60.0)
ITL_LE = (0.01, 0.025, 0.05, 0.1)
TOKENS_LE = (100, 1000, 10000, 100000)


def _hist(name: str, help_: str, les, per_engine: dict[str, tuple[list[float], float]]) -> str:
    """per_engine: engine -> (cumulative counts per finite le plus +Inf, sum)."""
    out = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
    for engine, (counts, total) in per_engine.items():
        labels = f'engine="{engine}",model_name="deepseek-ai/DeepSeek-V4.1-Flash"'
        for le, c in zip((*les, "+Inf"), counts, strict=True):
            le_s = le if le == "+Inf" else float(le)
            out.append(f'{name}_bucket{{{labels},le="{le_s}"}} {float(c)}')
        out.append(f"{name}_count{{{labels}}} {float(counts[-1])}")
        out.append(f"{name}_sum{{{labels}}} {float(total)}")
    return "\n".join(out)


def _scalar(name: str, kind: str, help_: str, per_engine: dict[str, float], extra: str = "") -> str:
    exposed = f"{name}_total" if kind == "counter" else name
    out = [f"# HELP {exposed} {help_}", f"# TYPE {exposed} {kind}"]
    created = [f"# HELP {name}_created {help_}", f"# TYPE {name}_created gauge"]
    for engine, v in per_engine.items():
        labels = f'engine="{engine}",{extra}model_name="deepseek-ai/DeepSeek-V4.1-Flash"'
        out.append(f"{exposed}{{{labels}}} {float(v)}")
        created.append(f"{name}_created{{{labels}}} 1.7643e+09")
    # prometheus_client puts a counter's _created samples in a gauge family of their own
    return "\n".join(out + (created if kind == "counter" else []))


def page(engines: dict[str, dict]) -> str:
    """engines: engine label -> dict of figures (see keys below); missing keys default to 0."""
    g = lambda key, default=0.0: {e: v.get(key, default) for e, v in engines.items()}  # noqa: E731
    h = lambda key, les: {e: v.get(key, ([0.0] * (len(les) + 1), 0.0)) for e, v in engines.items()}  # noqa: E731
    parts = [
        _scalar("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", g("running")),
        _scalar("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", g("waiting")),
        _scalar("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", g("kv")),
        _scalar("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.", g("prompt_tokens")),
        _scalar("vllm:generation_tokens", "counter", "Number of generation tokens processed.", g("gen_tokens")),
        _scalar("vllm:prefix_cache_queries", "counter", "Prefix cache queries, in terms of number of queried tokens.", g("queries")),
        _scalar("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens.", g("hits")),
        _scalar("vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine.", g("preemptions")),
        _scalar("vllm:request_success", "counter", "Count of successfully processed requests.", g("success_stop"), 'finished_reason="stop",'),
        _hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_LE, h("ttft", TTFT_LE)),
        _hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", E2E_LE, h("e2e", E2E_LE)),
        _hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_LE, h("itl", ITL_LE)),
        _hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", TTFT_LE, h("queue", TTFT_LE)),
        _hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKENS_LE, h("prompt_len", TOKENS_LE)),
        _hist("vllm:request_generation_tokens", "Number of generation tokens processed.", TOKENS_LE, h("gen_len", TOKENS_LE)),
    ]
    return "\n".join(parts) + "\n"
