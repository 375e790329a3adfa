"""Every string kvtop makes for a person from a state, whatever text the state holds
(Hypothesis): fleet rows and cells, leak alerts, the detail text, the snapshot table and
check's text hold no control or bidi character, and the JSON still holds the exact value."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtop.collect.target import Target
from kvtop.commands.check import _render_text
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetState
from kvtop.derive.verdicts import LeakVerdict
from kvtop.derive.worst import CheckRun, EngineVerdict
from kvtop.report.snapshot import snapshot_document
from kvtop.ui.screens.detail import CONFIG_KEYS, describe
from kvtop.view.fleet import build_rows
from kvtop.view.table import table_text
from kvtop.view.verdict_changes import leak_changes
from tests.hostile.hostile import RAW_CONTROLS

NOW = 1000.0
# Text that leans on what matters here: controls, escapes, bidi, markup brackets, newlines.
nasty = st.text(alphabet=st.sampled_from(
    ["\x1b", "\x07", "\x9b", "\n", "\r", "\t", "\u202e", "\u2066", "\u200b", "\ufeff",
     "[", "]", "/", "=", "'", "a", "b", "0", " ", "\U000e0041", "\ud800"]), max_size=40)
anything = st.text(max_size=40) | nasty


def _state(name: str, url_tail: str, model: str, engine: str, error: str, version: str,
           config: dict[str, str], note: str) -> TargetState:
    target = Target(url=f"http://10.0.0.1:8000/m{url_tail}", name=name or None)
    leak = LeakVerdict("leak", "idle floor rose", 10.0, 100.0, 3.0)
    engines = [EngineStats(m, engine, NOW, blocks_used=1, blocks_total=2, leak=leak,
                           cache_config=config) for m in (model, model + "2")]
    return TargetState(target, "up", error=error, kind="vllm", version=version,
                       engines=engines, last_good_t=NOW, notes=[note])


def _safe(text: str) -> bool:
    return not RAW_CONTROLS.findall(text) and "\ud800" not in text


@settings(max_examples=60, deadline=None)
@given(name=anything, url_tail=anything, model=anything, engine=anything, error=anything,
       version=anything, config=st.dictionaries(anything, anything, max_size=3), note=anything)
def test_nothing_from_a_state_reaches_a_person_raw(
        name: str, url_tail: str, model: str, engine: str, error: str, version: str,
        config: dict[str, str], note: str) -> None:
    state = _state(name, url_tail, model, engine, error, version, config, note)
    down = TargetState(Target(url="http://10.0.0.2:8000/metrics", name=name or None), "down",
                       error=error, last_good_t=NOW)
    for row in build_rows([state, down], NOW):
        assert _safe(row.name)
        assert all(_safe(cell.text) for cell in row.cells.values())
    changes, _ = leak_changes([state], {})
    assert changes and all(_safe(change.name) for change in changes)
    # the same state with plain words: a newline in a value must not add a line
    plain_config = {"k": "v"} if set(config) - {"engine", *CONFIG_KEYS} else {}
    benign = _state("n", "t", "m", "e", "err" if error else "", "v", plain_config, "note")
    expected = len(describe(benign, benign.engines[0], NOW).plain.split("\n"))
    for stats in state.engines:
        lines = describe(state, stats, NOW).plain.split("\n")
        assert all(_safe(line) for line in lines) and len(lines) == expected

    document = snapshot_document([state, down], [], taken_at=datetime.now(timezone.utc))
    assert _safe(table_text([state, down], document))
    assert document["targets"][0]["engines"][0]["model"] == model  # exact
    assert json.loads(json.dumps(document))["targets"][0]["error"] == error


@settings(max_examples=60, deadline=None)
@given(url=anything, model=anything, engine=anything)
def test_check_text_is_safe(url: str, model: str, engine: str) -> None:
    run = CheckRun()
    run.engines[url] = {(model, engine): EngineVerdict(model, engine)}
    lines = _render_text(run.to_json()).split("\n")
    assert len(lines) == 3 and all(_safe(line) for line in lines)  # verdict, engine, ""
