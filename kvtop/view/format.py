"""Number formatting for the views. ``None`` (not exported / unknown) is always "–", never 0."""

from __future__ import annotations

DASH = "–"
BAR_CELLS = 5


def count(value: float | None) -> str:
    """A count, compact above 10 000 (20184 -> 20.2k) so columns stay narrow."""
    if value is None:
        return DASH
    if abs(value) >= 1_000_000:
        return f"{value / 1_000_000:.1f}M"
    if abs(value) >= 10_000:
        return f"{value / 1000:.1f}k"
    return f"{value:.0f}"


def rate(value: float | None) -> str:
    """A per-second rate: one decimal below 10 (0.4, never a bare 0 for something that
    happens), whole numbers above; a rate too small for one decimal is "<0.1"."""
    if value is None:
        return DASH
    if value == 0:
        return "0"
    if abs(value) < 0.05:
        return "<0.1" if value > 0 else "-<0.1"
    return f"{value:.1f}" if round(abs(value), 1) < 10 else count(value)


def percent(fraction: float | None) -> str:
    return DASH if fraction is None else f"{fraction * 100:.0f}%"


def seconds(value: float | None) -> str:
    """A latency: ms below one second, seconds above."""
    if value is None:
        return DASH
    if value < 1:
        return f"{value * 1000:.0f}ms"
    return f"{value:.1f}s" if value < 100 else f"{value:.0f}s"


def age(value: float | None) -> str:
    """An age like 12s, 4m, 3h."""
    if value is None:
        return DASH
    if value < 60:
        return f"{value:.0f}s"
    if value < 3600:
        return f"{value / 60:.0f}m"
    return f"{value / 3600:.0f}h"


def slope(per_hour: float | None) -> str:
    """A blocks-per-hour trend in at most 7 cells: +420/h, +1.2k/h, +12k/h."""
    if per_hour is None:
        return DASH
    size = abs(per_hour)
    if size >= 10_000:
        number = f"{size / 1000:.0f}k"
    elif size >= 1000:
        number = f"{size / 1000:.1f}k"
    else:
        number = f"{size:.0f}"
    return f"{'-' if per_hour < 0 else '+'}{number}/h"


def hours(value: float | None) -> str:
    """A projection like 45m, 2.7h, 3d."""
    if value is None:
        return DASH
    if value < 1:
        return f"{value * 60:.0f}m"
    return f"{value:.1f}h" if value < 48 else f"{value / 24:.0f}d"


def bytes_gib(value: int | None) -> str:
    return DASH if value is None else f"{value / 2**30:.1f}"


EIGHTHS = " ▏▎▍▌▋▊▉"  # a cell filled 0/8 .. 7/8 from the left


def bar(fraction: float | None, cells: int = BAR_CELLS) -> str:
    """``████▉``: eighth-cell resolution, so 98 % never looks like 75 %. Any use shows at
    least an eighth and only a full pool fills every cell."""
    if fraction is None:
        return "·" * cells
    fraction = min(max(fraction, 0.0), 1.0)
    total = cells * 8
    eighths = round(fraction * total)
    if fraction > 0:
        eighths = max(eighths, 1)
    if fraction < 1:
        eighths = min(eighths, total - 1)
    full, part = divmod(eighths, 8)
    text = "█" * full + (EIGHTHS[part] if part else "")
    return text + "░" * (cells - len(text))


def kv_cell(
    usage: float | None, used: float | None, total: int | None, cells: int = BAR_CELLS
) -> str:
    """The KV column: a bar and used/total blocks, or the usage percent when blocks are unknown."""
    if usage is None and used is not None and total:
        usage = used / total
    if usage is None:
        return DASH
    if used is not None and total is not None:
        return f"{bar(usage, cells)} {count(used)}/{count(total)}"
    return f"{bar(usage, cells)} {percent(usage)}"
