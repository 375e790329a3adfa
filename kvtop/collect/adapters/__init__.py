"""Engine adapters: a parsed ``/metrics`` exposition -> :class:`ServerReading`.

One cheap pass keeps only the samples some adapter wants (the union of their names), then
the engine is recognised by which names are present. GPU exporters (dcgm-exporter,
nvidia_gpu_exporter) are recognised the same way and give GPUs instead of engines.

:func:`adapt` is total: whatever a server sends, it answers a reading. One whose values
can't be a KV pool (``num_gpu_blocks="inf"``), that is over the parser's limits, or that
an adapter failed on, is *refused* (``ServerReading.refused`` says why; the target is then
``bad_payload``). Impossible values (usage 1.7, a negative counter, buckets going down) are
left out and noted; engines past ``MAX_ENGINES`` are left out and counted.
"""

from __future__ import annotations

import logging
from types import ModuleType

from kvtop.collect.adapters import (
    dcgm,
    llamacpp,
    nvidia_gpu_exporter,
    sglang,
    trtllm,
    vllm,
)
from kvtop.collect.adapters.common import MAX_ENGINES, BadValue
from kvtop.collect.adapters.plausible import drop_impossible
from kvtop.collect.exposition import MAX_WANTED_LINES, Exposition, parse
from kvtop.collect.reading import ServerKind, ServerReading

log = logging.getLogger(__name__)

ADAPTERS: tuple[tuple[str, ServerKind, ModuleType], ...] = (
    ("vllm:", "vllm", vllm), ("sglang:", "sglang", sglang),
    ("llamacpp:", "llamacpp", llamacpp), ("nv_trt_llm_", "trtllm", trtllm),
    ("DCGM_FI_", "dcgm", dcgm), ("nvidia_smi_", "nvidia_gpu_exporter", nvidia_gpu_exporter))
WANTED = frozenset().union(*(module.NAMES for _, _, module in ADAPTERS))
NOTED_VALUES = 3  # impossible values named in the note; the rest are counted


def names_for(text: str) -> frozenset[str]:
    """The sample names the adapter for this ``/metrics`` body reads (every adapter's when
    none is recognised): what a narrowed read of that server asks for."""
    for prefix, _, module in ADAPTERS:
        if prefix in text:
            return module.NAMES
    return WANTED


def adapt(expo: Exposition, version: str | None = None) -> ServerReading:
    """Pick the adapter whose names the exposition carries (never raises)."""
    if expo.refused is not None:
        return ServerReading("unknown", version=version, refused=expo.refused)
    if len(expo.samples) > MAX_WANTED_LINES:  # samples handed over parsed (Prometheus)
        return ServerReading("unknown", version=version, refused=(
            f"{len(expo.samples):,} series; more than {MAX_WANTED_LINES:,} is not one server's"))
    for prefix, kind, module in ADAPTERS:
        if any(sample.name.startswith(prefix) for sample in expo.samples):
            try:
                reading = module.adapt(expo, version)
            except BadValue as exc:
                return ServerReading(kind, version=version, refused=str(exc))
            except Exception as exc:  # a body nobody foresaw: that target fails, not kvtop
                log.exception("the %s adapter failed", kind)
                return ServerReading(kind, version=version, refused=(
                    f"kvtop could not read this answer ({type(exc).__name__}: "
                    f"{str(exc)[:120]}); a bug in kvtop, please report it"))
            break
    else:
        reading = ServerReading("unknown", version=version, notes=[
            "no inference-server metrics found: not vLLM, SGLang, llama.cpp or TRT-LLM "
            "(or vLLM started with --disable-log-stats)"])
    _note_limits(reading, expo)
    return reading


def _note_limits(reading: ServerReading, expo: Exposition) -> None:
    """Leave out impossible values, and say what was left out or skipped."""
    found = []
    for engine in reading.engines:
        who = "/".join(part[:60] for part in (engine.model, engine.engine) if part is not None)
        found += [f"{who}: {what}" if who else what for what in drop_impossible(engine)]
    if found:
        reading.impossible_values = len(found)
        more = f" and {len(found) - NOTED_VALUES} more" if len(found) > NOTED_VALUES else ""
        reading.notes.append(f"impossible values left out: {'; '.join(found[:NOTED_VALUES])}"
                             f"{more}")
    if reading.engines_over_cap:
        reading.notes.append(
            f"too many engines: {MAX_ENGINES + reading.engines_over_cap:,} (kvtop shows at "
            f"most {MAX_ENGINES} per target); the first {MAX_ENGINES} are shown")
    reading.parse_errors = len(expo.errors)
    if expo.errors:
        first = expo.errors[0]
        reading.notes.append(f"{len(expo.errors)} malformed line(s) skipped; first at line "
                             f"{first.line_no}: {first.reason}")


def read_exposition(text: str, version: str | None = None) -> ServerReading:
    """Parse and adapt one ``/metrics`` body (never raises)."""
    return adapt(parse(text, keep=WANTED), version)
