"""v41flash: a Kubernetes operator serving DeepSeek-V4.1-Flash disaggregated on vLLM."""
