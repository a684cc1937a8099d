"""Home of the engine pods' serving port (a leaf: engine, gateway, network, router and the scrapers import it)."""
ENGINE_PORT = 8000  # vLLM's API (and /metrics); in mode Gateway with prefill, the decode pod's routing sidecar owns it
