"""Home of vLLM 0.33.0's metric names (without the _total suffix for counters): the operator's scraper
(metrics/parse.py), the endpoint picker's flags (render/gateway.py) and the tests take them from here. A leaf."""
from __future__ import annotations

TTFT = "vllm:time_to_first_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"
ITL = "vllm:inter_token_latency_seconds"
QUEUE = "vllm:request_queue_time_seconds"
PREFILL_TIME = "vllm:request_prefill_time_seconds"
PROMPT_LEN = "vllm:request_prompt_tokens"
GEN_LEN = "vllm:request_generation_tokens"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"  # the endpoint picker's default is the name before vLLM 0.10
PROMPT_TOKENS = "vllm:prompt_tokens"
GEN_TOKENS = "vllm:generation_tokens"
PREFIX_HITS = "vllm:prefix_cache_hits"
PREFIX_QUERIES = "vllm:prefix_cache_queries"
SUCCESS = "vllm:request_success"
PREEMPTIONS = "vllm:num_preemptions"
# A histogram of tokens per engine step: its count moves every step, also inside a long chunked prefill that
# finishes no request and emits no token (the hang watchdog's finest progress signal, when the engine has it)
ITERATION_TOKENS = "vllm:iteration_tokens_total"
