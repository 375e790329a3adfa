"""The help screen's text: every key's line whole at 80 columns, live and in a replay, and
one name per leak state as the table says it."""

from __future__ import annotations

import pytest

from kvtop.ui.replay import ReplayApp
from kvtop.ui.screens.help import KEYS, WIDTH, help_text


@pytest.mark.parametrize("keys", [KEYS, ReplayApp.HELP_KEYS], ids=["live", "replay"])
def test_every_key_is_said_whole_within_80_columns(keys) -> None:
    text = help_text(keys).plain
    for key, what in keys:
        assert f"{key} {what}" in text, (key, what)  # never "step one scrape (pauses fi"
    assert max(len(line) for line in text.splitlines()) <= WIDTH


def test_the_replay_help_says_its_keys_and_no_interval() -> None:
    keys = dict(ReplayApp.HELP_KEYS)
    assert keys["."] == "step a round of scrapes" and "< >" in keys and "+ -" not in keys
    assert not any("→" in key for key in keys if key != "← →")  # → opens a group, as live


def test_the_legend_names_each_leak_state_as_the_table_does() -> None:
    text = help_text(KEYS).plain
    assert "WARMUP" in text and "… warming up" not in text
