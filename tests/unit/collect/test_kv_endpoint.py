"""Where a target's KV events come from (the config's and the command line's forms) and how
its channel's state reads from its ranks."""

from __future__ import annotations

import pytest

from kvtop.collect.kv_endpoint import (
    KvChannel,
    KvEventsEndpoint,
    RankStatus,
    parse_endpoint,
    parse_endpoint_argument,
)


@pytest.mark.parametrize("url, kwargs, error", [
    ("http://h:1", {}, "kv_events must be tcp://host:port"),
    ("tcp://h", {}, "kv_events must be tcp://host:port"),
    ("tcp://h:0", {}, "kv_events must be tcp://host:port"),
    ("tcp://h:1", {"replay": "tcp://h:0"}, "kv_events replay must be tcp://host:port"),
    ("tcp://h:1", {"replay": "tcp://h:65535", "ranks": 2},
     "kv_events: 2 ranks from tcp://h:65535 pass port 65535"),
    ("tcp://h:99999", {}, "kv_events: Port out of range 0-65535"),
    ("tcp://h:1/x", {}, "kv_events must be tcp://host:port"),
    ("tcp://h:1", {"replay": "h:2"}, "kv_events replay must be tcp://host:port"),
    ("tcp://h:1", {"ranks": 0}, "kv_events ranks must be a whole number from 1 to 64"),
    ("tcp://h:1", {"ranks": 65}, "kv_events ranks must be a whole number from 1 to 64"),
    ("tcp://h:1", {"ranks": True}, "kv_events ranks must be a whole number from 1 to 64"),
    ("tcp://h:65535", {"ranks": 2}, "kv_events: 2 ranks from tcp://h:65535 pass port 65535"),
    ("tcp://h:1", {"bind": "yes"}, "kv_events listen must be true or false"),
])
def test_an_endpoint_that_cannot_be_used_says_why(url: str, kwargs: dict, error: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_endpoint(url, **kwargs)
    assert str(raised.value) == error


def test_rank_r_is_on_the_port_plus_r() -> None:
    endpoint = parse_endpoint("tcp://gpu-1:5557", replay="tcp://gpu-1:5558", ranks=64)
    assert endpoint.rank_url(endpoint.url, 0) == "tcp://gpu-1:5557"
    assert endpoint.rank_url(endpoint.url, 63) == "tcp://gpu-1:5620"
    assert endpoint.rank_url("tcp://[::1]:5557", 2) == "tcp://[::1]:5559"


def test_the_command_line_names_the_publisher_and_its_replay_after_a_comma() -> None:
    assert parse_endpoint_argument("tcp://gpu-1:5557") == KvEventsEndpoint("tcp://gpu-1:5557")
    assert parse_endpoint_argument("tcp://gpu-1:5557, tcp://gpu-1:5558") == KvEventsEndpoint(
        "tcp://gpu-1:5557", "tcp://gpu-1:5558")
    with pytest.raises(ValueError, match="kv_events replay must be tcp://host:port"):
        parse_endpoint_argument("tcp://gpu-1:5557,gpu-1:5558")


def channel(*states: str, error: str | None = None) -> KvChannel:
    ranks = [RankStatus(r, state) for r, state in enumerate(states)]  # type: ignore[arg-type]
    return KvChannel(KvEventsEndpoint("tcp://h:1", ranks=max(len(states), 1)), ranks, error)


@pytest.mark.parametrize("states, error, expected", [
    ((), None, "connecting"),  # not opened yet
    (("connecting", "connecting"), None, "connecting"),
    (("connected", "connecting"), None, "connecting"),  # not every rank yet
    (("connected", "connected"), None, "connected"),
    (("connected", "disconnected"), None, "disconnected"),  # one rank lost is told
    (("connected",), "Address already in use", "failed"),
])
def test_a_channel_is_connected_only_when_every_rank_is(states: tuple[str, ...],
                                                       error: str | None,
                                                       expected: str) -> None:
    assert channel(*states, error=error).state == expected


def test_a_channel_sums_its_ranks_counts() -> None:
    both = channel("connected", "connected")
    both.ranks[0].lost, both.ranks[1].lost, both.ranks[1].gaps = 2, 3, 1
    assert both.total("lost") == 5 and both.total("gaps") == 1


def test_the_last_rank_may_sit_on_port_65535() -> None:
    endpoint = parse_endpoint("tcp://h:65534", replay="tcp://h:65533", ranks=2)
    assert endpoint.rank_url(endpoint.url, 1) == "tcp://h:65535"
    assert parse_endpoint("tcp://h:65535").rank_url("tcp://h:65535", 0) == "tcp://h:65535"
