"""Cut the trace samples kvtop ships (kvtop/sim/traces/) from the full public traces.

    python3 scripts/sample_traces.py FULL_TRACES_DIR [--minutes 20]

FULL_TRACES_DIR holds the unmodified files `mooncake_conversation_trace.jsonl.gz` (Mooncake,
FAST'25) and `AzureLLMInferenceTrace_conv.csv` (Azure LLM inference 2023); see
kvtop/sim/traces/README.md for where to get them. Each sample is the trace's first
`--minutes` of arrivals, every kept line byte for byte as in the source (the CSV keeps its
header), gzip-compressed with no name or time stamp so the output is reproducible.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from datetime import datetime
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "kvtop" / "sim" / "traces"
MOONCAKE = ("mooncake_conversation_trace.jsonl.gz", "mooncake_conversation_trace.sample.jsonl.gz")
AZURE = ("AzureLLMInferenceTrace_conv.csv", "AzureLLMInferenceTrace_conv.sample.csv.gz")


def _write_gzip(path: Path, lines: list[bytes]) -> None:
    with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9,
                                               filename="", mtime=0) as out:
        out.writelines(lines)


def mooncake_sample(source: Path, seconds: float) -> list[bytes]:
    """Rows whose arrival (`timestamp`, ms since the trace began) is before `seconds`."""
    with gzip.open(source, "rb") as f:
        return [line for line in f if line.strip()
                and json.loads(line)["timestamp"] < seconds * 1000]


def azure_sample(source: Path, seconds: float) -> list[bytes]:
    """The header and the rows within `seconds` of the first arrival (the file is sorted)."""
    with source.open("rb") as f:
        header, *rows = f.readlines()
    start = _azure_time(rows[0])
    return [header, *(row for row in rows
                      if (_azure_time(row) - start).total_seconds() < seconds)]


def _azure_time(row: bytes) -> datetime:
    stamp = row.split(b",", 1)[0].decode()[:26]  # 7 fractional digits; datetime takes 6
    return datetime.fromisoformat(stamp)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("full_traces_dir", type=Path)
    parser.add_argument("--minutes", type=float, default=20.0)
    args = parser.parse_args()
    seconds = args.minutes * 60
    for (name, sample), cut in ((MOONCAKE, mooncake_sample), (AZURE, azure_sample)):
        source = args.full_traces_dir / name
        if not source.is_file():
            print(f"sample_traces: {source} not found", file=sys.stderr)
            return 2
        lines = cut(source, seconds)
        _write_gzip(OUT / sample, lines)
        print(f"{OUT / sample}: {len(lines)} lines, {(OUT / sample).stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
