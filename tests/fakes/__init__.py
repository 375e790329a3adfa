"""Test doubles for the parts of kvtop that touch the outside world (NVML, the network)."""
