"""The simulator against vLLM 0.33's real scheduler (the twin), step by step."""
