"""The app's collection model: one tracker per target (and one for each server a source
finds later, as Prometheus does), each scrape folded into its target's at once, even while
the display is paused, and the baseline overlay fed every good scrape. A replay's rewind
starts them all afresh, and the same code rebuilds history, rates and leak evidence."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from kvtop.baseline.overlay import BaselineOverlay
    from kvtop.collect.reading import EngineReading
    from kvtop.collect.target import Scrape, Target
    from kvtop.derive.tracker import EngineKey, TargetState


class Folding(Protocol):
    """What folding needs of a tracker (:class:`~kvtop.derive.tracker.TargetTracker`)."""

    @property
    def state(self) -> TargetState: ...

    def update(self, scrape: Scrape) -> TargetState: ...

    @property
    def readings(self) -> dict[EngineKey, EngineReading]: ...


T = TypeVar("T", bound=Folding)


class FleetTrackers(Generic[T]):
    def __init__(self, factory: Callable[[Target], T], targets: list[Target],
                 overlay: BaselineOverlay | None) -> None:
        self._factory = factory
        self._targets = targets
        self._overlay = overlay
        self.by_url: dict[str, T] = self._new()

    def _new(self) -> dict[str, T]:
        return {target.url: self._factory(target) for target in self._targets}

    def reset(self) -> None:
        self.by_url = self._new()
        if self._overlay is not None:
            self._overlay.clear()

    def fold(self, scrape: Scrape) -> tuple[T, bool]:
        """The tracker that folded ``scrape``, and whether it was its target's first."""
        tracker = self.by_url.get(scrape.target.url)
        if tracker is None:  # a server the source discovered after start (Prometheus)
            tracker = self.by_url[scrape.target.url] = self._factory(scrape.target)
        first = tracker.state.status == "pending"
        state = tracker.update(scrape)  # drops a scrape older than one already folded
        if self._overlay is not None and scrape.ok and state.last_good_t == scrape.t:
            self._overlay.observe(scrape.target.url, scrape.t, state.engines, tracker.readings)
        return tracker, first

    def states(self) -> list[TargetState]:
        return [tracker.state for tracker in self.by_url.values()]
