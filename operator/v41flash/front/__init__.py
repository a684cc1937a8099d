"""The serving front: Envoy configured by the operator (front/envoy.py, the Lua request step front.lua) and the
counters the planner reads from it (front/counters.py, `v41flash front-counters`)."""
