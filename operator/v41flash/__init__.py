"""v41flash: a Kubernetes operator serving DeepSeek-V4.1-Flash disaggregated on vLLM.

Where each fact lives (every user imports it from there; nothing else spells it out):
- vLLM flags and the model facts they rest on (default checkpoint, routed experts, EPLB communicators):
  vllm/args.py; what vLLM 0.33.0's parser accepts (the snapshot, sync-only EPLB communicators):
  vllm/flags.py
- GPU products, GPUs per node, default TP/DP per profile: vllm/gpus.py
- role names (prefill, decode): roles.py
- defaults the CR and the planner share (interval, stabilization, SLO window, replica bounds): defaults.py;
  every other CR default: the field in api/v1alpha1.py
- labels, child names, selectors: render/labels.py; ports: render/engine.py (engine), render/router.py
  (router); engine pods' drain and probe timing: render/timing.py
- session proxy defaults: proxy/__init__.py
"""
