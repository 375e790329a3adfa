"""kvtop's vLLM 0.33.0 twin: vLLM's own scheduler and metrics with a model-less forward pass.

Not part of the installed package. The modules that import vllm run only under the twin
interpreter (``.venv-twin``, made by ``scripts/install-twin.sh``) with the repository root on
PYTHONPATH; ``twin.model`` imports nothing but the standard library. README.md says more.
"""
