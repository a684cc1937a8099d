"""v41flash: a Kubernetes operator serving DeepSeek-V4.1-Flash disaggregated on vLLM.

Where each fact lives (every user imports it from there; nothing else spells it out):
- vLLM flags: vllm/args.py; what vLLM 0.33.0's parser accepts (the snapshot): vllm/flags.py
- the model, engine and proxy facts the API's schema is generated from (default checkpoint, routed experts,
  DSpark block, EPLB communicators and the sync-only ones, KV load-failure policies, session-key modes, the model
  loaders and the ones spec.startup offers): facts.py
- GPU products, GPUs per node, default TP/DP per profile: gpus.py
- the recipe's InferenceX AgentX lanes (presets and points): lanes.py
- role names (prefill, decode): roles.py
- when a scheduled window starts (5-field cron in a time zone, DST rules): cron.py
- what one evaluation window observed (WindowFigures, RouterFigures): figures.py (metrics makes them, the planner
  reads them: neither imports the other for them)
- defaults the CR and the planner share (interval, stabilization, SLO window, replica bounds): defaults.py;
  every other CR default: the field in api/v1alpha1.py
- labels, child names, selectors: render/labels.py; every port a rendered pod listens on: render/ports.py;
  engine pods' drain and probe timing: render/timing.py; vLLM's metric names: vllm/metric_names.py; a pod's
  labels and Ready condition: pods.py; role and slot names: roles.py
- session proxy defaults: proxy/__init__.py

defaults.py, roles.py, facts.py, gpus.py, lanes.py, cron.py and figures.py are leaves (they import nothing of the
package): the API imports them and nothing else outside api/ (tests/test_layering.py).
"""
