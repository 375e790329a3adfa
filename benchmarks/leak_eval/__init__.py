"""The leak detector's evaluation: scenarios, recordings (simulator and vLLM twin), scores."""
