"""Grouping the fleet (F5): the modes offered, each row's group, and a Prometheus label's
name and value as outside text."""

from __future__ import annotations

import pytest

from kvtop.collect.adapters import WANTED
from kvtop.collect.exposition import Exposition, Sample, parse
from kvtop.collect.prometheus import group_scrapes
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.stats import EngineStats, Quantiles
from kvtop.derive.tracker import TargetState, TargetTracker
from kvtop.derive.verdicts import LeakVerdict, StallVerdict
from kvtop.view import format as fmt
from kvtop.view import groups
from kvtop.view.cells import Cell
from kvtop.view.fleet import FleetRow, build_rows
from kvtop.view.groups import (
    LABEL_PREFIX,
    MAX_LABEL_MODES,
    NONE,
    GroupRow,
    group_cells,
    group_modes,
    group_rows,
    group_value,
    make_group,
    mode_label,
    target_labels,
)
from tests.support.paths import fixture_text

UNDER_LOAD = "vllm-0.33.0-v1-twin-under-load.txt"
T0 = 1_767_225_600.0


def prometheus_rows(instance_labels: dict[str, str]) -> list[FleetRow]:
    """The real vLLM 0.33 scrape as Prometheus answers it, with ``instance_labels`` on every
    series (``cache_config_info``, with its ~37 labels, first: as Prometheus sorts them)."""
    samples = sorted(parse(fixture_text(UNDER_LOAD), keep=WANTED).samples,
                     key=lambda s: s.name != "vllm:cache_config_info")
    result = [{"metric": {"__name__": s.name, **s.labels, "job": "vllm",
                          "instance": "10.0.0.1:8000", **instance_labels},
               "values": [[T0, repr(s.value)]]} for s in samples]
    [(_, per_t)] = group_scrapes(result).items()
    target = Target(url="http://prom:9090#vllm/10.0.0.1:8000", name="10.0.0.1:8000",
                    group="vllm")
    tracker = TargetTracker(target)
    tracker.update(read_scrape(Scrape(target, T0, samples=Exposition(per_t[T0]))))
    return build_rows([tracker.state], T0)


def test_the_labels_of_an_instance_are_those_all_its_series_share() -> None:
    """They were taken from its first series, cache_config_info: F5 offered its block_size,
    cache_dtype... (8 at most) and never namespace."""
    [row] = prometheus_rows({"namespace": "prod", "pod": "vllm-7f9c"})
    assert target_labels(row) == {"namespace": "prod", "pod": "vllm-7f9c"}
    modes = group_modes([row])
    assert f"{LABEL_PREFIX}namespace" in modes and f"{LABEL_PREFIX}pod" in modes
    assert f"{LABEL_PREFIX}block_size" not in modes
    assert group_value(row, f"{LABEL_PREFIX}namespace") == "prod"


def test_label_modes_are_bounded() -> None:
    [row] = prometheus_rows({f"l{i:02d}": "v" for i in range(3 * MAX_LABEL_MODES)})
    labels = [m for m in group_modes([row]) if m.startswith(LABEL_PREFIX)]
    assert len(labels) == MAX_LABEL_MODES


def test_a_label_name_and_value_are_shown_through_the_boundary() -> None:
    """A label *named* a\\x1b[2J or a[/] reached the toast and the header raw (and a[/]
    stopped the app with a MarkupError)."""
    for name in ("a\x1b[2J", "a\x9b2J", "a\x1b]52;c;ZXZpbA==\x07", "a[/]"):
        [row] = prometheus_rows({name: "v\x1b[2J"})
        [mode] = [m for m in group_modes([row]) if m.startswith(LABEL_PREFIX)]
        assert "\x1b" not in mode_label(mode) and "\x9b" not in mode_label(mode)
        assert mode_label(mode).startswith("a") and "[/]" in mode_label("label:a[/]")
        assert group_value(row, mode) == "v\\x1b[2J"


def test_a_groups_limit_is_the_one_holding_most_members_back() -> None:
    from kvtop.derive.verdicts import LimitVerdict

    def state(port: int, *limits: str) -> TargetState:
        engines = [EngineStats("m", str(i), T0, limit=LimitVerdict(limit, "why"))  # type: ignore[arg-type]
                   for i, limit in enumerate(limits)]
        return TargetState(Target.from_spec(f"h:{port}"), "up", kind="vllm", engines=engines,
                           last_good_t=T0)

    held = build_rows([state(1, "kv_capacity", "none"), state(2, "kv_capacity",
                                                             "max_sequences")], T0)
    assert group_cells("g", held)["limit"] == Cell("KV 2", "warn")
    calm = build_rows([state(1, "none"), state(2, "none")], T0)
    assert group_cells("g", calm)["limit"] == Cell("none", "dim")
    mixed = build_rows([state(1, "none"), state(2, "unknown")], T0)
    assert group_cells("g", mixed)["limit"] == Cell(fmt.DASH, "dim")


# -- the labels of an instance, the modes and each row's group -------------------------------

def _scraped(samples: list[Sample]) -> FleetRow:
    """A row read from Prometheus whose last scrape holds ``samples``."""
    target = Target.from_spec("h:1")
    state = TargetState(target, "up", kind="vllm", last_good_t=T0,
                        last_good=Scrape(target, T0, samples=Exposition(samples)))
    [row] = build_rows([state], T0)
    return row


def test_an_instance_without_a_scrape_or_series_has_no_labels() -> None:
    """A target never read (or read directly) and one whose scrape holds no series: no
    labels, not a crash on the empty scrape."""
    never = build_rows([TargetState(Target.from_spec("h:1"), "down", last_good_t=None)], T0)
    assert target_labels(never[0]) == {}
    assert target_labels(_scraped([])) == {}


def test_one_series_gives_its_own_labels_less_those_of_series() -> None:
    scrape = prometheus_rows({"namespace": "prod"})[0].state.last_good
    assert scrape is not None and scrape.samples is not None
    [sample] = [s for s in scrape.samples.samples if s.name == "vllm:num_requests_running"]
    assert sample.labels == {"model_name": "twin-llama", "engine": "0",
                             "namespace": "prod"}
    assert target_labels(_scraped([sample])) == {"namespace": "prod"}


def test_an_instances_labels_are_worked_out_once_per_scrape(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same scrape asked again is the same answer (not worked out again), for every
    instance of a fleet at once."""
    monkeypatch.setattr(groups, "_common_labels", {})
    rows = [prometheus_rows({"pod": p})[0] for p in ("a", "b", "c")]
    first = [target_labels(row) for row in rows]
    assert first == [{"pod": "a"}, {"pod": "b"}, {"pod": "c"}]
    assert all(target_labels(row) is labels for row, labels in zip(rows, first, strict=True))


def test_the_label_cache_is_emptied_at_its_cap_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """2,048 scrapes' labels are kept; the next scrape empties the cache first (a fleet read
    from Prometheus makes a new scrape per instance every refresh)."""
    monkeypatch.setattr(groups, "_common_labels", {})
    [sample] = parse('vllm:num_requests_running{pod="p"} 1\n').samples
    rows = [_scraped([sample]) for _ in range(groups.MAX_CACHED_LABELS + 1)]
    for row in rows[:-1]:
        assert target_labels(row) == {"pod": "p"}
    assert len(groups._common_labels) == 2048  # at the cap: kept
    assert target_labels(rows[-1]) == {"pod": "p"}
    assert list(groups._common_labels.values()) == [
        (rows[-1].state.last_good.samples, {"pod": "p"})]  # type: ignore[union-attr]


def test_label_modes_stop_once_past_the_cap_exactly() -> None:
    """The modes are read from the rows until more than MAX_LABEL_MODES names are seen: with
    exactly that many, the next row's label still counts (sorted first); one more, not."""
    at_cap = prometheus_rows({f"z{i}": "v" for i in range(MAX_LABEL_MODES)})
    past_cap = prometheus_rows({f"z{i}": "v" for i in range(MAX_LABEL_MODES + 1)})
    other = prometheus_rows({"a": "v"})
    labels = [f"{LABEL_PREFIX}z{i}" for i in range(MAX_LABEL_MODES)]
    assert group_modes(at_cap + other) == [NONE, "group", "model", f"{LABEL_PREFIX}a",
                                           *labels[:-1]]
    assert group_modes(past_cap + other) == [NONE, "group", "model", *labels]
    assert group_modes(other + at_cap) == [NONE, "group", "model", f"{LABEL_PREFIX}a",
                                           *labels[:-1]]


def test_a_mode_and_a_group_value_are_cut_at_80_cells() -> None:
    name = "n" * 100
    assert mode_label(LABEL_PREFIX + name) == "n" * 79 + "…"
    [row] = prometheus_rows({"pod": "p" * 100})
    assert group_value(row, f"{LABEL_PREFIX}pod") == "p" * 79 + "…"


def test_a_rows_group_value_per_mode() -> None:
    rows = build_rows([_up("a:1", "prod", _engine("llama")),
                       TargetState(Target.from_spec("b:1"), "down", last_good_t=T0)], T0)
    assert [group_value(r, "group") for r in rows] == ["prod", "(none)"]
    assert [group_value(r, "model") for r in rows] == ["llama", "(none)"]
    assert [group_value(r, f"{LABEL_PREFIX}pod") for r in rows] == ["(none)", "(none)"]


# -- a group's aggregate row ------------------------------------------------------------------

WATCH = LeakVerdict("watch", "rising", 50.0, None, None)
OK = LeakVerdict("ok", "flat", None, None, None)


def _engine(model: str, **numbers: object) -> EngineStats:
    return EngineStats(model, None, T0, **numbers)  # type: ignore[arg-type]


def _up(spec: str, group: str | None, *engines: EngineStats) -> TargetState:
    return TargetState(Target.from_spec(spec, group=group), "up", kind="vllm",
                       engines=list(engines), last_good_t=T0)


def _down(spec: str, group: str | None) -> TargetState:
    return TargetState(Target.from_spec(spec, group=group), "down", failure="down",
                       last_good_t=T0 - 60)


def _busy() -> list[FleetRow]:
    """Two engines answering, each with every number, and a server down."""
    return build_rows([
        _up("a:1", "g", _engine("llama", kv_usage=0.5, blocks_total=1000, blocks_used=500.0,
                                running=3.0, waiting=2.0, preemptions_per_s=0.5, hit_rate=0.4,
                                hit_rate_scope="window", prefix_queries_per_s=10.0,
                                prompt_tps=100.0, generation_tps=50.0, leak=WATCH,
                                ttft=Quantiles(0.2, 0.5, 0.8, 40.0))),
        _up("b:1", "g", _engine("qwen", kv_usage=0.25, blocks_total=3000, blocks_used=750.0,
                                running=1.0, waiting=0.0, preemptions_per_s=0.25, hit_rate=0.2,
                                hit_rate_scope="window", prefix_queries_per_s=30.0,
                                prompt_tps=20.0, generation_tps=10.0, leak=OK,
                                ttft=Quantiles(0.1, 0.2, 0.3, 40.0))),
        _down("c:1", "g"),
    ], T0)


def test_a_groups_cells_sum_its_engines_and_show_its_worst() -> None:
    """Blocks, load and rates summed over the engines answering, the hit rate weighed by
    lookups, the worst status and leak cell of any member; percentiles never added."""
    assert group_cells("▾ g (3)", _busy()) == {
        "name": Cell("▾ g (3)", keep=4),
        "status": Cell("2/3 up", "bad"),
        "model": Cell("llama +1"),
        "kv": Cell("█▌░░░ 1250/4000", short="█░░ 1250/4000"),
        "leak": Cell("WATCH", "warn"),
        "running": Cell("4"),
        "waiting": Cell("2", "warn"),
        "limit": Cell(fmt.DASH, "dim"),
        "preempt": Cell("0.8", "bad"),
        "hit": Cell("25%"),
        "prompt": Cell("120"),
        "gen": Cell("60"),
        "ttft": Cell(fmt.DASH, "dim"),
        "gpu": Cell(fmt.DASH, "dim"),
    }


def test_a_quiet_group_has_no_warning_colours() -> None:
    """No queue, no preemption: plain cells (not amber, not red); one model is named alone;
    a name's count is kept even when the value has brackets of its own."""
    rows = build_rows([_up("a:1", "g", _engine("llama", kv_usage=0.1, running=0.0,
                                               waiting=0.0, preemptions_per_s=0.0)),
                       _up("b:1", "g", _engine("llama"))], T0)
    assert group_cells("▾ g (x) (2)", rows) == {
        "name": Cell("▾ g (x) (2)", keep=4),
        "status": Cell("2/2 up", "ok"),
        "model": Cell("llama"),
        "kv": Cell(fmt.DASH, short=fmt.DASH),
        "leak": Cell(fmt.DASH, "dim"),
        "running": Cell("0"),
        "waiting": Cell("0"),
        "limit": Cell(fmt.DASH, "dim"),
        "preempt": Cell("0"),
        "hit": Cell(fmt.DASH),
        "prompt": Cell(fmt.DASH),
        "gen": Cell(fmt.DASH),
        "ttft": Cell(fmt.DASH, "dim"),
        "gpu": Cell(fmt.DASH, "dim"),
    }


def test_a_groups_models_are_the_first_and_how_many_more() -> None:
    rows = build_rows([_up(f"{m}:1", "g", _engine(m)) for m in ("qwen", "llama", "mistral")],
                      T0)
    assert group_cells("g", rows)["model"] == Cell("llama +2")
    assert group_cells("g", rows[:2])["model"] == Cell("llama +1")
    assert group_cells("g", rows[:1])["model"] == Cell("qwen")


def test_a_group_without_engines_is_dashes_not_zeros() -> None:
    rows = build_rows([_down("a:1", "g"), _down("b:1", "g")], T0)
    dash = Cell(fmt.DASH, "dim")
    assert group_cells("▾ g (2)", rows) == {
        "name": Cell("▾ g (2)", keep=4), "status": Cell("0/2 up", "bad"),
        "model": Cell(fmt.DASH), "kv": Cell(fmt.DASH, short=fmt.DASH), "leak": dash,
        "running": dash, "waiting": dash, "limit": dash, "preempt": dash, "hit": dash,
        "prompt": dash, "gen": dash, "ttft": dash, "gpu": dash,
    }
    empty = group_cells("g", [])
    assert (empty["status"], empty["leak"]) == (Cell("0/0 up", "dim"), dash)


def test_a_groups_status_is_its_worst_members() -> None:
    """Up members are counted; the colour is the worst member's, whichever comes first."""
    stale = TargetState(Target.from_spec("s:1", group="g"), "stale", failure="timeout",
                        engines=[_engine("m")], last_good_t=T0 - 20)
    rows = build_rows([_up("a:1", "g", _engine("m")), stale], T0)
    assert group_cells("g", rows)["status"] == Cell("1/2 up", "warn")
    assert group_cells("g", rows[::-1])["status"] == Cell("1/2 up", "warn")
    both = build_rows([_up("a:1", "g", _engine("m")), _up("b:1", "g", _engine("m"))], T0)
    assert group_cells("g", both)["status"] == Cell("2/2 up", "ok")


def test_a_groups_leak_cell_is_its_worst_members() -> None:
    """By the cell's colour, then by the verdict: a WARMUP (judged, dim) outranks a dash
    (no verdict, dim) whichever comes first; a LEAK outranks a STALL (both red)."""
    warmup = LeakVerdict("warmup", "early", None, None, None)
    leak = LeakVerdict("leak", "rising", 90.0, 600.0, 2.0)
    stall = StallVerdict("stalled", "no progress", T0 - 30)
    dimmed = build_rows([_down("a:1", "g"), _up("b:1", "g", _engine("m", leak=warmup))], T0)
    assert group_cells("g", dimmed)["leak"] == Cell("WARMUP", "dim")
    assert group_cells("g", dimmed[::-1])["leak"] == Cell("WARMUP", "dim")
    red = build_rows([_up("a:1", "g", _engine("m", leak=warmup, stall=stall)),
                      _up("b:1", "g", _engine("m", leak=leak))], T0)
    assert group_cells("g", red)["leak"] == Cell("LEAK +600/h", "alarm", short="LEAK")
    assert group_cells("g", red[::-1])["leak"] == Cell("LEAK +600/h", "alarm", short="LEAK")
    calm = build_rows([_up("a:1", "g", _engine("m", leak=OK)),
                       _up("b:1", "g", _engine("m", leak=WATCH))], T0)
    assert group_cells("g", calm)["leak"] == Cell("WATCH", "warn")


def test_a_group_row_is_its_members_summed() -> None:
    rows = _busy()
    head = make_group("group", "g", rows, collapsed=False)
    assert isinstance(head, GroupRow) and head.is_group
    assert (head.key, head.url, head.engine, head.name, head.stats, head.members,
            head.collapsed) == ("group:group:g", "", None, "▾ g (3)", None, rows, False)
    assert head.state is rows[0].state
    assert head.status == Cell("2/3 up", "bad")
    assert head.cells == group_cells("▾ g (3)", rows)
    assert head.sort_values == {"worst": 6.5, "leak": 1.0, "ttft": 0.8, "hit": 0.4,
                                "kv": 0.3125, "running": 4.0, "waiting": 2.0, "prompt": 120.0,
                                "gen": 60.0, "preempt": 0.75}
    assert head.search == " ".join(r.search for r in rows)
    assert not GroupRow(key="k", url="", engine=None, name="▾ g (3)", state=rows[0].state,
                        stats=None, status=Cell("")).collapsed  # open unless shut
    shut = make_group("label:pod", "p", rows[1:], collapsed=True)
    assert (shut.key, shut.name, shut.collapsed) == ("group:label:pod:p", "▸ p (2)", True)
    assert shut.state is rows[1].state


def test_a_group_without_numbers_sorts_last() -> None:
    head = make_group("group", "g", build_rows([_down("a:1", "g")], T0), collapsed=False)
    assert head.sort_values == {"worst": 2.0, "leak": None, "ttft": None, "hit": None,
                                "kv": None, "running": 0.0, "waiting": 0.0, "prompt": None,
                                "gen": None, "preempt": None}


# -- the grouped table --------------------------------------------------------------------

def _fleet() -> list[FleetRow]:
    """Groups "_prod" (KV 90 %), "dev" (20 % and 30 % of equal pools) and a server in no
    group (50 %)."""
    def kv(model: str, usage: float) -> EngineStats:
        return _engine(model, kv_usage=usage, blocks_total=100, blocks_used=100 * usage)

    return build_rows([_up("p:1", "_prod", kv("qwen", 0.9)), _up("d1:1", "dev", kv("llama", 0.2)),
                       _up("n:1", None, kv("mistral", 0.5)),
                       _up("d2:1", "dev", kv("llama", 0.3))], T0)


def test_no_grouping_is_the_rows_as_given() -> None:
    rows = _fleet()
    assert group_rows(rows, NONE, set(), "name") is rows


def test_groups_follow_each_other_by_name_with_their_members_under_them() -> None:
    """A-Z by the group's value (not by its arrow, which tells open from shut), lower case
    first; the members in the order given."""
    rows = _fleet()
    shown = group_rows(rows, "group", set(), "name")
    assert [r.name for r in shown] == ["▾ (none) (1)", "n:1", "▾ _prod (1)", "p:1",
                                       "▾ dev (2)", "d1:1", "d2:1"]
    shown = group_rows(rows, "group", {"group:group:_prod"}, "name", reverse=True)
    assert [r.name for r in shown] == ["▾ dev (2)", "d1:1", "d2:1", "▸ _prod (1)",
                                       "▾ (none) (1)", "n:1"]
    shut = group_rows(rows, "group", {"group:group:dev", "group:group:(none)"}, "model")
    assert [r.name for r in shut] == ["▸ (none) (1)", "▾ _prod (1)", "p:1", "▸ dev (2)"]
    assert [r.members for r in shut if isinstance(r, GroupRow)] == [[rows[2]], [rows[0]],
                                                                    [rows[1], rows[3]]]
    assert [r.key for r in shut if isinstance(r, GroupRow)] == [
        "group:group:(none)", "group:group:_prod", "group:group:dev"]


def test_groups_by_a_number_follow_their_members_figures() -> None:
    rows = _fleet()
    shown = group_rows(rows, "model", set(), "kv")
    assert [r.name for r in shown] == ["▾ qwen (1)", "p:1", "▾ mistral (1)", "n:1",
                                       "▾ llama (2)", "d1:1", "d2:1"]
    shown = group_rows(rows, "model", set(), "kv", reverse=True)
    assert [r.name for r in shown] == ["▾ llama (2)", "d1:1", "d2:1", "▾ mistral (1)", "n:1",
                                       "▾ qwen (1)", "p:1"]
