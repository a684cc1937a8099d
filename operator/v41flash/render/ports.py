"""Home of every port the rendered pods listen on (a leaf: engine, gateway, network, router and the scrapers import
it)."""
ENGINE_PORT = 8000  # vLLM's API (and /metrics); in mode Gateway with prefill, the decode pod's routing sidecar owns it
VLLM_BEHIND_SIDECAR_PORT = 8200  # a decode pod's vLLM when the routing sidecar owns the serving port

# The front and the slots' routers (render/router.py)
ROUTER_PORT = 30000  # the front pod's "http" port (the Service's target): the session proxy
ROUTER_INTERNAL_PORT = 30001  # a slot's vllm-router, reachable from the deployment's router pods only
METRICS_PORT = 29000  # vllm-router's Prometheus listener
SERVICE_PORT = ENGINE_PORT  # clients reach the router where they would reach vLLM itself

# The endpoint picker (render/gateway.py)
EPP_GRPC_PORT = 9002  # ext-proc (the Gateway's gRPC client); TLS with the EPP's own certificate
EPP_HEALTH_PORT = 9003  # gRPC health (probes)
EPP_METRICS_PORT = 9090
