"""A real Prometheus with hostile label values: a job and a namespace holding quotes,
backslashes and newlines (a target sets them; honor_labels or relabelling lets it), beside a
healthy job. kvtop quotes every value it puts in a query as a PromQL string, so the healthy
instances are read and the hostile ones too; and any label value round-trips through
Prometheus's own parser (Hypothesis)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtop.collect.prometheus.promql import literal_regex, matcher, string
from tests.prometheus.conftest import _wait_ready, start_prometheus, stop

pytestmark = pytest.mark.prometheus

BAD_JOB = 'bad"job\\with\nnewline'
BAD_NAMESPACE = 'ns"quoted\\back\nline'


def _yaml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a YAML double-quoted scalar


@pytest.fixture(scope="module")
def hostile_prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """(Prometheus URL, healthy instance, hostile instance)."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Prometheus tier skipped: no 'prometheus' binary on PATH")
    tmp = tmp_path_factory.mktemp("hostile-prometheus")
    server = subprocess.Popen([sys.executable, "-m", "tests.hostile.serve"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    prometheus = None
    try:
        assert server.stdout is not None
        urls = json.loads(server.stdout.readline())
        good = urls["healthy"].removeprefix("http://").removesuffix("/metrics")
        evil = urls["hostile"].removeprefix("http://").removesuffix("/metrics")
        (tmp / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: vllm\n    static_configs:\n"
            f"      - targets: [\"{good}\"]\n"
            f"      - targets: [\"{evil}\"]\n"
            f"        labels: {{job: {_yaml(BAD_JOB)}, namespace: {_yaml(BAD_NAMESPACE)}}}\n")
        prometheus, url = start_prometheus(binary, tmp)
        _wait_ready(url, [good, evil], prometheus)
        yield url, good, evil
    finally:
        stop(prometheus, server)


def _snapshot(url: str, *extra: str) -> tuple[int, dict[str, object], str]:
    done = subprocess.run([sys.executable, "-m", "kvtop", "snapshot", "--prometheus", url,
                           "--json", "--no-gpu", *extra], capture_output=True, text=True,
                          timeout=120)
    return done.returncode, json.loads(done.stdout or "{}"), done.stderr


def test_a_job_with_quotes_backslashes_and_newlines_loses_no_instance(
        hostile_prom: tuple[str, str, str]) -> None:
    """One job="bad\\"job" made the `up` query a parse error (HTTP 400): exit 3, no targets."""
    url, good, evil = hostile_prom
    code, document, err = _snapshot(url)
    assert code == 0, err
    targets = {t["label"]: t for t in document["targets"]}  # type: ignore[union-attr]
    assert set(targets) == {good, evil}
    assert all(t["status"] == "up" for t in targets.values()), targets
    assert targets[evil]["target"].endswith(f"#{BAD_JOB}/{evil}")


def test_a_selector_built_by_the_quoting_function_picks_the_hostile_namespace(
        hostile_prom: tuple[str, str, str]) -> None:
    url, _, evil = hostile_prom
    selector = "{" + matcher("namespace", "=", BAD_NAMESPACE) + "}"
    code, document, err = _snapshot(url, "--selector", selector)
    assert code == 0, err
    assert [t["label"] for t in document["targets"]] == [evil]  # type: ignore[union-attr]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(value=st.text(st.characters(exclude_categories=("Cs",)), max_size=30))
def test_any_label_value_round_trips_through_prometheus(
        hostile_prom: tuple[str, str, str], value: str) -> None:
    """string() is read back by PromQL as the value; literal_regex() matches exactly it
    (label_replace's regex is anchored RE2). The first label_replace writes the value as
    its replacement, where Go expands `$0`: `$$` writes one `$`."""
    url = hostile_prom[0]
    replacement = string(value.replace("$", "$$"))
    query = (f'label_replace(label_replace(vector(1), "v", {replacement}, "", ""), '
             f'"hit", "yes", "v", {string(literal_regex(value))})')
    answer = httpx.post(f"{url}/api/v1/query", data={"query": query}, timeout=10).json()
    assert answer["status"] == "success", (value, answer)
    [series] = answer["data"]["result"]
    assert series["metric"].get("v", "") == value
    assert series["metric"].get("hit") == "yes"
