"""Scripts that print the numbers the docs quote; run each as `python -m benchmarks.NAME`
from the repository root (`--quick` for a seconds-long run, which tests/unit/test_benchmarks.py
runs so that none of them rots)."""
