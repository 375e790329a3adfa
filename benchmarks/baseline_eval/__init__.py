"""The baseline comparison's evaluation: healthy reruns and planted changes."""
