"""Behaviour tests written where mutation testing (scripts/mutation.py, docs/testing.md) showed
that a planted bug passed every other test. Each test states what a user relies on."""
