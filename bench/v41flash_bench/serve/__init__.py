"""`v41flash bench serve`: measure a live deployment or any OpenAI-compatible endpoint (records, plots, A/B)."""
