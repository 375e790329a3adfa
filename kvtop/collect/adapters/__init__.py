"""Engine adapters: a parsed ``/metrics`` exposition -> :class:`ServerReading`.

One cheap pass keeps only the samples some adapter wants (the union of their names), then
the engine is recognised by which names are present. GPU exporters (dcgm-exporter,
nvidia_gpu_exporter) are recognised the same way and give GPUs instead of engines.
"""

from __future__ import annotations

from kvtop.collect.adapters import dcgm, llamacpp, nvidia_gpu_exporter, sglang, trtllm, vllm
from kvtop.collect.exposition import Exposition, parse
from kvtop.collect.reading import ServerReading

ADAPTERS = (("vllm:", vllm), ("sglang:", sglang), ("llamacpp:", llamacpp),
            ("nv_trt_llm_", trtllm), ("DCGM_FI_", dcgm), ("nvidia_smi_", nvidia_gpu_exporter))
WANTED = frozenset().union(*(module.NAMES for _, module in ADAPTERS))


def names_for(text: str) -> frozenset[str]:
    """The sample names the adapter for this ``/metrics`` body reads (every adapter's when
    none is recognised): what a narrowed read of that server asks for."""
    for prefix, module in ADAPTERS:
        if prefix in text:
            return module.NAMES
    return WANTED


def adapt(expo: Exposition, version: str | None = None) -> ServerReading:
    """Pick the adapter whose names the exposition carries."""
    for prefix, module in ADAPTERS:
        if any(sample.name.startswith(prefix) for sample in expo.samples):
            reading = module.adapt(expo, version)
            break
    else:
        reading = ServerReading("unknown", version=version, notes=[
            "no inference-server metrics found: not vLLM, SGLang, llama.cpp or TRT-LLM "
            "(or vLLM started with --disable-log-stats)"])
    reading.parse_errors = len(expo.errors)
    if expo.errors:
        first = expo.errors[0]
        reading.notes.append(f"{len(expo.errors)} malformed line(s) skipped; first at line "
                             f"{first.line_no}: {first.reason}")
    return reading


def read_exposition(text: str, version: str | None = None) -> ServerReading:
    """Parse and adapt one ``/metrics`` body."""
    return adapt(parse(text, keep=WANTED), version)
