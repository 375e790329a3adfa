"""Screens pushed over the fleet view (detail, help)."""
