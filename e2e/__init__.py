"""End-to-end tests and the local real control plane they run on (`python -m e2e.harness up`, `python -m e2e.demo`).

An importable package of the checkout (not in the image): run its modules with `-m` from the repository root.
"""
