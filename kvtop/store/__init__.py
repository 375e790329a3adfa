"""Recordings: every scrape of a monitoring run, kept for replay and post-mortems."""
