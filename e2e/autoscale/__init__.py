"""The autoscaling e2e test's capacity profile of the simulated engines and the calibration that measures it."""
