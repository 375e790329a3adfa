"""A plotext chart of a few time series, drawn at the widget's size."""

from __future__ import annotations

from dataclasses import dataclass

from rich.style import Style
from rich.text import Span, Text
from textual.widgets import Static

from kvtop.view import format as fmt


@dataclass(frozen=True, slots=True)
class Series:
    label: str
    points: tuple[tuple[float, float], ...]  # (seconds relative to now, value); unknowns left out


@dataclass(frozen=True, slots=True)
class Reference:
    """A level drawn across the whole chart, dim and dotted: a baseline's value."""

    label: str | None  # None: in the legend already (the other edge of a band)
    value: float


REFERENCE_COLOUR = 8  # grey: dim beside the series' colours, whatever the theme


def time_ticks(span_s: float) -> tuple[list[float], list[str]]:
    """Tick positions (seconds before now, negative) and labels like -4m, -2m, now."""
    step = next((s for s in (10, 30, 60, 120, 300, 600, 1800) if span_s / s <= 5), 3600)
    ticks = [-step * i for i in range(int(span_s // step), 0, -1)] + [0.0]
    return ticks, [("now" if t == 0 else "-" + fmt.age(-t)) for t in ticks]


def render_plot(title: str, series: list[Series], width: int, height: int, span_s: float,
                references: tuple[Reference, ...] = ()) -> Text:
    """The chart as Rich text; backgrounds dropped so it sits on the app's theme."""
    drawable = [s for s in series if s.points]
    if width < 20 or height < 5 or not drawable:
        return Text(f"{title}: no data yet" if width >= 20 else "")
    import plotext  # a third of a second to import: paid when a chart is first drawn

    figure = plotext.figure
    figure.clear()
    figure.plot_size(width, height)
    for item in drawable:
        xs, ys = zip(*item.points, strict=True)
        signal = figure.signal(list(xs), list(ys), marker="braille")
        signal.label(item.label)
        signal.lines()
        figure.draw(signal)
    for reference in references:
        figure.line(reference.value, style="dotted", pixel=REFERENCE_COLOUR,
                    label=reference.label)
    if references:  # a baseline above or below everything drawn stays in sight
        values = [y for item in drawable for _, y in item.points]
        values += [r.value for r in references]
        low, high = min(0.0, *values), max(values)
        figure.ruler("y").lim(low, high * 1.05 if high > 0 else high + 1)
    ticks, labels = time_ticks(span_s)
    figure.ruler("x").lim(-span_s, 0)
    figure.ruler("x").ticks(ticks, labels)
    figure.title(title)
    text = Text.from_ansi(str(figure.build()).rstrip("\n"), no_wrap=True)
    text.spans = [Span(s.start, s.end, _foreground(s.style)) for s in text.spans]
    return text


_PLAIN = {0, 7, 15, 16}  # plotext's black/white frame colours: let the theme colour these


def _foreground(style: str | Style) -> Style:
    style = Style.parse(style) if isinstance(style, str) else style
    color = style.color
    if color is not None and color.number in _PLAIN:
        color = None
    return Style(color=color, bold=style.bold)


class HistoryPlot(Static):
    """Holds its series and redraws them on resize; the app decides when data changes."""

    def __init__(self, title: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._title = title
        self._series: list[Series] = []
        self._references: tuple[Reference, ...] = ()
        self._span_s = 300.0

    def show_series(self, series: list[Series], span_s: float,
                    references: tuple[Reference, ...] = ()) -> None:
        self._series, self._span_s, self._references = series, span_s, references
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    def _draw(self) -> None:
        width, height = self.content_size
        self.update(render_plot(self._title, self._series, width, height, self._span_s,
                                self._references))
