"""kvtop: htop for the KV cache of LLM inference servers."""

__version__ = "0.1.0"
