"""The kvtop terminal app (Textual): views render the states the collectors produce."""
