"""Recordings from vLLM 0.33's real scheduler: runs `twin_driver.py` in the twin venv.

The twin interpreter is `$KVTOP_TWIN_PYTHON`, default `.venv-twin/bin/python` (see
scripts/install-twin.sh); it imports the repository's `twin` package (twin/README.md).
Without that interpreter the twin scenarios are skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from benchmarks.leak_eval.scenarios import EPOCH, Scenario, TruthLog
from benchmarks.paths import REPO
from kvtop.collect.target import Scrape, Target
from kvtop.store.recording import RecordingWriter
from twin.serve import twin_python

WARMUP_S = 120.0  # stepped before the recording starts; the twin's requests last seconds

DRIVER = Path(__file__).with_name("twin_driver.py")
TIMEOUT_S = 3600  # vLLM's own scheduler, stepped in Python: minutes each on a loaded 2-core box


def generate_twin(scenario: Scenario, out: Path, seed: int = 0) -> tuple[Path, Path]:
    python = twin_python()
    if not python.exists():
        raise FileNotFoundError("no twin interpreter (.venv-twin): run scripts/install-twin.sh")
    spec_path, raw_path = out / f"{scenario.name}.spec.json", out / f"{scenario.name}.raw.jsonl"
    spec = {**scenario.params, "seed": seed, "blocks": scenario.blocks,
            "max_num_seqs": scenario.max_num_seqs, "warmup_s": WARMUP_S,
            "duration_s": WARMUP_S + scenario.duration_s, "interval_s": scenario.interval_s,
            "leak_fill_h": scenario.leak_fill_h, "leak_at_s": WARMUP_S + scenario.leak_at_s,
            "lumps": [[WARMUP_S + at, frac * scenario.blocks] for at, frac in scenario.lumps]}
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    # run() kills the child on timeout, so no twin outlives this call.
    subprocess.run([str(python), str(DRIVER), str(spec_path), str(raw_path)], env=env,
                   check=True, timeout=TIMEOUT_S, capture_output=True)
    rec_path, truth_path = out / f"{scenario.name}.jsonl.gz", out / f"{scenario.name}.truth.json"
    truth = TruthLog(scenario)
    target = Target(url=f"twin://{scenario.name}")
    with RecordingWriter(rec_path, interval_s=scenario.interval_s, targets=[target]) as writer, \
            raw_path.open() as raw:
        for text in raw:
            line = json.loads(text)
            if "leak_start_s" in line:
                truth.leak_start_t = EPOCH + line["leak_start_s"]
                truth.leak_frac = line["leak_frac"]
                continue
            t = EPOCH + line["t"]
            writer.write(Scrape(target, t, body=line["body"], version="0.33.0"))
            truth.scrapes.append([t, line["leaked"], line["used"], line["running"],
                                  line["waiting"]])
    truth.write(truth_path)
    raw_path.unlink()
    return rec_path, truth_path
