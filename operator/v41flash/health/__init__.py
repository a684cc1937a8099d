"""Engine health from the engines' own metrics (pure): the hang watchdog (``watchdog``: requests running and no
progress for N seconds) and the straggler finder (``stragglers``: an engine slower than its role's peers at comparable
load). controller/engine_health.py scrapes the engines, feeds these, and acts on what they find."""
