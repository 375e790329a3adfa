"""One rehearsal from start to report: identify the target, read it idle, drive (or only
watch) the load for the duration, let it drain, read it idle again, judge, write the files.

Ctrl-C (or SIGTERM) ends the load early: requests in flight are cut, the "after" reading is
skipped, and the report is written on what was gathered. So does a verdict that can no
longer change (the leak detector's LEAK, a STALLED engine: each is NO-GO by itself), unless
``full_duration``: after a leak the load drains and the floor is read again, after a stall
requests in flight are cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, TextIO

import aiohttp
import orjson

from kvtop.collect.clock import stop_event
from kvtop.collect.nvml import GpuReader
from kvtop.collect.target import Target
from kvtop.derive.leak_params import LeakParams
from kvtop.load.driver import DriverSettings, LoadDriver, RequestRecord, RunClock
from kvtop.load.openai_client import NotOpenAI, ServedModel, list_models, make_session
from kvtop.load.workloads import Workload, WorkloadError, make_workload
from kvtop.rehearse.advice import advise, load_figures
from kvtop.rehearse.criteria import Criterion, Span
from kvtop.rehearse.gpu_memory import judge_gpu
from kvtop.rehearse.kv_free import judge_kv
from kvtop.rehearse.latency import judge_latency, judge_latency_histograms
from kvtop.rehearse.progress import Progress
from kvtop.rehearse.report import FORMAT_VERSION, render_text
from kvtop.rehearse.requests import CODE, RequestTable
from kvtop.rehearse.verdict import DEFAULT_MAX_ERROR_RATE, Requests, decide, judge_stall
from kvtop.rehearse.watch import EnginePoint, GpuPoint, Watcher
from kvtop.safe_text import file_text, json_bytes
from kvtop.store.recording import RecordingWriter

FIRST_SCRAPE_WALL_S = 15.0  # to read /metrics once before giving up
DEFINITE_FAILURES = ("auth", "bad_payload")  # no point waiting: asking again won't help
BEFORE_SCRAPES = 3  # idle reads before the load
AFTER_IDLE_SCRAPES = 3  # idle reads after it
DRAIN_GRACE_S = 60.0  # target seconds requests in flight may finish in after the duration
SETTLE_S = 60.0  # target seconds the server may take to go idle after that
MODELS_TIMEOUT_S = 10.0
CLOSED_LOOP_CONCURRENCY = 8
OPEN_LOOP_CONCURRENCY = 256
PROGRESS_NAMES = {"gpu_memory": "GPU", "kv_free": "KV", "latency": "latency"}
PROGRESS_STATES = {"ok": "ok", "watch": "watch", "fail": "fail", "not_judged": "-"}
FILES = {"recording": "recording.jsonl.gz", "requests": "requests.jsonl",
         "gpus": "gpus.jsonl", "report_json": "report.json", "report_text": "report.txt"}


class CannotRun(Exception):
    """The rehearsal could not start: the target can't be identified or read (exit 3)."""


class BadUsage(Exception):
    """A setting the target or the files refuse: unknown model, bad trace, no --out (exit 2)."""


@dataclass(frozen=True)
class RehearsalSettings:
    metrics: Target  # the /metrics URL, with the token
    api_base: str | None  # ".../v1"; None with watch_only
    duration_s: float
    out_dir: Path
    workload: str = "mixed"
    rate: float | None = None
    concurrency: int | None = None  # None: 8 in a closed loop, 256 under a rate or a trace
    model: str | None = None
    strict: bool = False
    watch_only: bool = False
    chat: bool = False
    token_ids: bool = False
    interval_s: float = 1.0
    scrape_timeout_s: float | None = None
    request_timeout_s: float = 300.0
    retries: int = 1
    time_scale: float = 1.0
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE
    insecure: bool = False
    full_metrics: bool = False
    leak_params: LeakParams | None = None
    seed: int = 0
    drain_s: float = DRAIN_GRACE_S  # how long requests in flight at the end may finish in
    full_duration: bool = False  # run on after a confirmed leak or stall

    @property
    def in_flight(self) -> int:
        if self.concurrency is not None:
            return self.concurrency
        timed = self.workload not in ("mixed", "shared-prefix")
        return OPEN_LOOP_CONCURRENCY if self.rate or timed else CLOSED_LOOP_CONCURRENCY


@dataclass
class _Outputs:
    """The run's files, opened as needed and closed together."""

    out_dir: Path
    requests: IO[bytes] | None = None
    gpus: IO[bytes] | None = None

    def path(self, key: str) -> Path:
        return self.out_dir / FILES[key]

    def request(self, record: RequestRecord) -> None:
        if self.requests is None:
            self.requests = self.path("requests").open("wb")
        self.requests.write(json_bytes(record.to_json()) + b"\n")
        self.requests.flush()

    def gpu(self, point: GpuPoint) -> None:
        if self.gpus is None:
            self.gpus = self.path("gpus").open("wb")
        self.gpus.write(json_bytes(asdict(point)) + b"\n")

    def close(self) -> None:
        for file in (self.requests, self.gpus):
            if file is not None:
                file.close()


async def rehearse(settings: RehearsalSettings, *, gpu_reader: GpuReader | None,
                   progress: TextIO | None) -> dict[str, Any]:
    """Run the rehearsal; the report document (also written to ``out_dir``)."""
    try:
        settings.out_dir.mkdir(parents=True, exist_ok=True)
        # the run owns its --out folder and replaces its files, as it does requests.jsonl
        writer = RecordingWriter(settings.out_dir / FILES["recording"], replace=True,
                                 interval_s=settings.interval_s, targets=[settings.metrics])
    except OSError as exc:
        raise BadUsage(f"cannot write to {settings.out_dir}: {exc.strerror or exc}") from None
    outputs = _Outputs(settings.out_dir)
    with writer, contextlib.closing(outputs):
        return await _Rehearsal(settings, writer, outputs, gpu_reader, progress).run()


class _Rehearsal:
    def __init__(self, settings: RehearsalSettings, writer: RecordingWriter,
                 outputs: _Outputs, gpu_reader: GpuReader | None,
                 progress: TextIO | None) -> None:
        self.settings = settings
        self.outputs = outputs
        self.clock = RunClock(settings.time_scale)
        self.started_at = datetime.now(timezone.utc)
        self.table = None if settings.watch_only else RequestTable()
        self.watcher = Watcher(
            settings.metrics, self.clock, interval_s=settings.interval_s,
            timeout_s=settings.scrape_timeout_s, insecure=settings.insecure,
            full_metrics=settings.full_metrics, leak_params=settings.leak_params,
            writer=writer, gpu_reader=gpu_reader,
            gpu_interval_s=max(settings.interval_s, 5.0), histograms=settings.watch_only,
            on_gpu=outputs.gpu)
        self.progress_stream = progress
        self.progress: Progress | None = None
        self._progress_task: asyncio.Task[None] | None = None
        self.model: ServedModel | None = None
        self.workload: Workload | None = None
        self.load_start = self.load_end = 0.0
        self.interrupted = asyncio.Event()
        self.stopped_early: tuple[str, str] | None = None  # ("leak" | "stalled", why)

    async def run(self) -> dict[str, Any]:
        self.interrupted = stop_event()
        settings = self.settings
        async with make_session(insecure=settings.insecure,
                                limit=settings.in_flight + 2) as session:
            if not settings.watch_only:
                await self._identify(session)
            watch_stop = asyncio.Event()
            watching = asyncio.create_task(self.watcher.run(watch_stop))
            try:
                await self._first_reads()
                await self._load(session)
                await self._after()
            finally:
                watch_stop.set()
                if self._progress_task is not None:  # it says what the drain and after wait for
                    self._progress_task.cancel()
                await asyncio.gather(*(t for t in (watching, self._progress_task) if t),
                                     return_exceptions=True)
        return self._report()

    async def _identify(self, session: aiohttp.ClientSession) -> None:
        settings = self.settings
        assert settings.api_base is not None
        token = settings.metrics.token.reveal() if settings.metrics.token else None
        try:
            models = await list_models(session, settings.api_base, token=token,
                                       timeout_s=MODELS_TIMEOUT_S)
        except NotOpenAI as exc:
            raise CannotRun(str(exc)) from None
        names = [m.id for m in models]
        if settings.model is not None and settings.model not in names:
            raise BadUsage(f"--model {settings.model!r} is not served there; it serves "
                           + ", ".join(repr(n) for n in names))
        self.model = next(m for m in models if settings.model in (None, m.id))
        try:
            self.workload = make_workload(settings.workload,
                                          model_len=self.model.max_model_len,
                                          seed=settings.seed, rate=settings.rate)
        except WorkloadError as exc:
            raise BadUsage(str(exc)) from None

    async def _first_reads(self) -> None:
        watcher, data = self.watcher, self.watcher.data
        await watcher.wait_for(lambda: data.scrapes > 0 or self.interrupted.is_set()
                               or data.last_failure in DEFINITE_FAILURES,
                               FIRST_SCRAPE_WALL_S * self.clock.scale)
        if data.scrapes == 0 and not self.interrupted.is_set():
            raise CannotRun(f"cannot read {self.settings.metrics.url}: "
                            f"{data.last_error or 'no answer'}")
        if data.kind == "unknown":
            raise CannotRun(f"{self.settings.metrics.url} is not an inference server's "
                            "/metrics (no vLLM, SGLang, llama.cpp or TensorRT-LLM metrics)")
        await watcher.wait_for(
            lambda: data.scrapes >= BEFORE_SCRAPES or self.interrupted.is_set(),
            (BEFORE_SCRAPES + 2) * self.settings.interval_s)

    async def _load(self, session: aiohttp.ClientSession) -> None:
        settings, clock = self.settings, self.clock
        self.watcher.phase = "load"
        self.load_start = clock.now()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        timer = loop.call_later(clock.wall(settings.duration_s), stop.set)
        relay = asyncio.create_task(_relay(self.interrupted, stop))
        certain = (None if settings.full_duration
                   else asyncio.create_task(self._stop_when_certain(stop)))
        self._progress_task = self._start_progress()
        try:
            if self.workload is None:
                await stop.wait()
                self.load_end = clock.now()
            else:
                driver = self._driver(session)
                await driver.run(stop)
                self.load_end = clock.now()
                cut_now = self.interrupted.is_set() or self._stopped_by("stalled")
                grace = 0.0 if cut_now else min(settings.request_timeout_s, settings.drain_s)
                if self.progress is not None:
                    self.progress.drain(self.load_end + grace, lambda: driver.counts.in_flight)
                await driver.finish(grace)
        finally:
            timer.cancel()
            tasks = [t for t in (relay, certain) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _stop_when_certain(self, stop: asyncio.Event) -> None:
        """End the load once a confirmed LEAK or a STALLED engine makes it NO-GO whatever
        follows; the progress line says so."""
        while not stop.is_set():
            await self.clock.sleep_until(self.clock.now() + self.settings.interval_s, stop)
            found = self._certain()
            if found is not None and not stop.is_set():
                self.stopped_early = found
                if self.progress is not None:
                    self.progress.say(f"stopping early: {found[1]} (--full-duration runs on)")
                stop.set()

    def _certain(self) -> tuple[str, str] | None:
        for verdict in self.watcher.data.verdicts.values():
            name = " ".join(p for p in (verdict.model, verdict.engine) if p) or "engine"
            if verdict.verdict == "leak" and verdict.at_worst is not None:
                return "leak", f"{name}: LEAK confirmed ({verdict.at_worst.reason})"
            if verdict.stall == "stalled" and verdict.stall_at_worst is not None:
                return "stalled", f"{name}: STALLED ({verdict.stall_at_worst.reason})"
        return None

    def _stopped_by(self, kind: str) -> bool:
        return self.stopped_early is not None and self.stopped_early[0] == kind

    def _driver(self, session: aiohttp.ClientSession) -> LoadDriver:
        settings = self.settings
        assert self.model is not None and self.workload is not None and settings.api_base
        driver_settings = DriverSettings(
            settings.api_base, self.model.id, rate=settings.rate,
            concurrency=settings.in_flight, request_timeout_s=settings.request_timeout_s,
            retries=settings.retries, chat=settings.chat, token_ids=settings.token_ids,
            seed=settings.seed)
        token = settings.metrics.token.reveal() if settings.metrics.token else None
        return LoadDriver(driver_settings, self.workload, session, self.clock,
                          self._on_record, token=token)

    def _on_record(self, record: RequestRecord) -> None:
        if self.table is not None:
            self.table.add(record)
        self.outputs.request(record)
        if self.progress is not None:
            self.progress.add(record)

    def _start_progress(self) -> asyncio.Task[None] | None:
        if self.progress_stream is None:
            return None
        self.progress = Progress(self.progress_stream, self.clock, self.settings.duration_s,
                                 self.table, self._kv_usage, self._criteria_now)
        self.progress.load_start = self.load_start
        return asyncio.create_task(self.progress.run())

    def _kv_usage(self) -> float | None:
        usages = [e.kv_usage for e in self.watcher.engines if e.kv_usage is not None]
        return max(usages) if usages else None

    def _criteria_now(self) -> dict[str, str]:
        """The criteria so far: provisional ("ok?") until the load ends, except what is
        certain already (the detector's LEAK, a STALLED engine)."""
        span = Span(self.load_start, self.clock.now())
        states = {PROGRESS_NAMES[c.name]: PROGRESS_STATES[c.state] + ("" if c.state ==
                                                                      "not_judged" else "?")
                  for c in self._criteria(span)}
        certain = self._certain()
        if certain is not None:
            states["KV" if certain[0] == "leak" else "STALL"] = (
                "LEAK" if certain[0] == "leak" else "")
        return states

    async def _after(self) -> None:
        """Wait for the server to go idle so the floor can be read again (driven runs)."""
        watcher = self.watcher
        watcher.phase = "after"
        if self.progress is not None:
            self.progress.settle()
        if self.interrupted.is_set() or self._stopped_by("stalled"):
            return
        if self.settings.watch_only:
            seen = self.watcher.data.scrapes
            await watcher.wait_for(lambda: self.watcher.data.scrapes >= seen + AFTER_IDLE_SCRAPES
                                   or self.interrupted.is_set(),
                                   (AFTER_IDLE_SCRAPES + 2) * self.settings.interval_s)
            return
        await watcher.wait_for(
            lambda: watcher.idle_scrapes("after") >= AFTER_IDLE_SCRAPES
            or self.interrupted.is_set(),
            SETTLE_S + (AFTER_IDLE_SCRAPES + 2) * self.settings.interval_s)

    # -- the report ---------------------------------------------------------------------

    def _span(self) -> Span:
        return Span(self.load_start, max(self.load_end, self.load_start))

    def _criteria(self, span: Span) -> list[Criterion]:
        data = self.watcher.data
        params = self.settings.leak_params or LeakParams()
        latency = (judge_latency(self.table, span) if self.table is not None
                   else judge_latency_histograms(data.ttft, span))
        return [judge_gpu(data.gpus, span, data.gpu_unavailable),
                judge_kv(data, params, span), latency]

    def _report(self) -> dict[str, Any]:
        settings, data, table = self.settings, self.watcher.data, self.table
        criteria = self._criteria(self._span())
        by_name = {c.name: c for c in criteria}
        error_rate = table.error_rate() if table is not None else None
        stall = judge_stall(data)
        load_s = self.load_end - self.load_start
        requests = (Requests(len(table), table.statuses["ok"], error_rate)
                    if table is not None else None)
        decision = decide(criteria, strict=settings.strict, error_rate=error_rate,
                          max_error_rate=settings.max_error_rate, stall=stall,
                          requests=requests, load_s=load_s)
        figures = load_figures(data, self._span(), table)
        model_len = self.model.max_model_len if self.model else None
        expected = self.workload.expected_hit_rate if self.workload else None
        advice = []
        if decision.verdict == "no-go":
            advice = advise(by_name, figures, model_len=model_len,
                            expected_hit_rate=expected, error_rate=error_rate,
                            errors=dict(table.errors) if table else {}, stall=stall)
        doc = {
            "kvtop_rehearse": FORMAT_VERSION,
            "started_at": self.started_at.isoformat(timespec="seconds"),
            "ended_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "target": {"api": settings.api_base, "metrics": settings.metrics.url,
                       "model": self.model.id if self.model else None,
                       "max_model_len": model_len,
                       "server": {"kind": data.kind, "version": data.version,
                                  "version_inferred": data.version_inferred}},
            "settings": self._settings_json(),
            "run": {"load_s": _num(load_s, 3), "stopped": self._stopped(),
                    "stopped_reason": self.stopped_early[1] if self.stopped_early else None,
                    "restarts_s": [_num(t - self.load_start, 3) for t in data.restarts],
                    "failed_across_restarts": self._failed_across_restarts(),
                    "scrapes": data.scrapes, "failed_scrapes": data.failed_scrapes},
            "verdict": decision.verdict, "rule": decision.rule, "failed": decision.failed,
            "reasons": decision.reasons, "evidence": decision.evidence,
            "missing": decision.missing, "stall": stall.to_json(self.load_start),
            "criteria": {c.name: {"title": c.title, "state": c.state, "reason": c.reason,
                                  "figures": c.figures} for c in criteria},
            "requests": _requests_json(table) if table is not None else None,
            "server": {**{k: _num(v, 4) for k, v in asdict(figures).items()},
                       "expected_hit_rate": _num(expected, 4)},
            "kv": {"engines": [_kv_json(key, points) for key, points in data.points.items()]},
            "advice": [asdict(a) for a in advice],
            "files": self._files(),
        }
        self._write(doc)
        return doc

    def _stopped(self) -> str:
        if self.interrupted.is_set():
            return "interrupted"
        return self.stopped_early[0] if self.stopped_early else "duration"

    def _failed_across_restarts(self) -> int | None:
        """First attempts that failed while a restart happened (within a scrape interval)."""
        table, restarts = self.table, self.watcher.data.restarts
        if table is None:
            return None
        slack = self.settings.interval_s
        error, timeout = CODE["error"], CODE["timeout"]
        return sum(1 for i in range(len(table)) if table.outcome[i] in (error, timeout)
                   and any(table.t[i] - slack <= r <= table.t[i] + table.total[i] + slack
                           for r in restarts))

    def _settings_json(self) -> dict[str, Any]:
        s = self.settings
        return {"workload": None if s.watch_only else s.workload, "rate": s.rate,
                "concurrency": None if s.watch_only else s.in_flight,
                "duration_s": s.duration_s, "interval_s": s.interval_s,
                "request_timeout_s": s.request_timeout_s, "retries": s.retries,
                "strict": s.strict, "watch_only": s.watch_only,
                "api": "chat" if s.chat else "completions", "token_ids": s.token_ids,
                "time_scale": s.time_scale, "max_error_rate": s.max_error_rate,
                "full_duration": s.full_duration}

    def _files(self) -> dict[str, str | None]:
        out = {key: str(self.outputs.path(key)) for key in FILES}
        if self.table is None:
            out["requests"] = None
        if self.outputs.gpus is None:
            out["gpus"] = None
        return out

    def _write(self, doc: dict[str, Any]) -> None:
        try:
            self.outputs.path("report_json").write_bytes(
                json_bytes(doc, orjson.OPT_INDENT_2) + b"\n")
            self.outputs.path("report_text").write_text(file_text(render_text(doc)),
                                                        encoding="utf-8")
        except OSError as exc:
            raise BadUsage(f"cannot write the report to {self.settings.out_dir}: "
                           f"{exc.strerror or exc}") from None


async def _relay(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()


def _requests_json(table: RequestTable) -> dict[str, Any]:
    statuses = table.statuses
    return {"first_attempts": len(table), "sent": table.sent, "ok": statuses["ok"],
            "failed": table.failed, "timeouts": statuses["timeout"],
            "dropped": statuses["dropped"], "cut": statuses["cut"],
            "error_rate": _num(table.error_rate(), 4),
            "errors": dict(table.errors.most_common(10)),
            "retries": {"sent": sum(table.retries.values()), "ok": table.retries["ok"]},
            "tokens": {"answered_requests": table.answered, "prompt": table.prompt_tokens,
                       "completion": table.completion_tokens},
            "classes": {name: sum(1 for c in table.cls if c == i)
                        for i, name in enumerate(table.classes)}}


def _kv_json(key: tuple[str | None, str | None], points: list[EnginePoint]) -> dict[str, Any]:
    def state(phase: str) -> dict[str, Any] | None:
        found = [p for p in points if p.phase == phase]
        if not found:
            return None
        last = found[-1]
        return {"used_blocks": _num(last.used, 1), "blocks_total": last.total,
                "usage": _num(last.usage, 4), "idle": last.idle}

    usages = [p.usage for p in points if p.phase == "load" and p.usage is not None]
    return {"model": key[0], "engine": key[1], "before": state("before"),
            "after": state("after"), "peak_usage": _num(max(usages), 4) if usages else None}


def _num(value: float | None, digits: int = 6) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)

