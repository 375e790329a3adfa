"""Where baselines live: ``$XDG_DATA_HOME/kvtop/baselines/NAME.json`` (by default
``~/.local/share/kvtop/baselines``), or any path given instead of a name."""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvtop.baseline.model import Baseline, BaselineError, loads
from kvtop.files import UnreadableFile, read_regular

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# A baseline holds ~20 figures per engine, each a value per minute of the run: 100 engines
# over a day is ~3 million values, ~25 MB. Past either bound a file is refused before it is
# parsed: 57 MB of numbers once took 2.4 GB and 62 s to read.
MAX_BYTES = 32 * 2**20
MAX_VALUES = 4_000_000


def baselines_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "kvtop" / "baselines"


def is_path(spec: str) -> bool:
    """A spec with a directory part or a .json suffix is a file; anything else a name."""
    return "/" in spec or os.sep in spec or spec.endswith(".json")


def baseline_path(spec: str) -> Path:
    """The file of baseline ``spec`` (a name or a path); a bad name is a BaselineError."""
    if is_path(spec):
        return Path(spec).expanduser()
    if not NAME.fullmatch(spec):
        raise BaselineError(f"{spec!r} is not a baseline name (letters, digits, '.', '_', "
                            "'-'; up to 100) nor a path to a .json file")
    return baselines_dir() / f"{spec}.json"


def exists(spec: str) -> bool:
    try:
        return baseline_path(spec).is_file()
    except BaselineError:
        return False


def load(spec: str) -> Baseline:
    """Read baseline ``spec``; BaselineError says why it can't be used."""
    path = baseline_path(spec)
    try:
        raw = read_regular(path, MAX_BYTES)
    except UnreadableFile as exc:
        if exc.missing:
            hint = "" if is_path(spec) else " (kvtop baseline list shows the saved ones)"
            raise BaselineError(f"no baseline {spec!r} at {path}{hint}") from None
        raise BaselineError(f"{path}: {exc}, not a kvtop baseline") from None
    values = raw.count(b",") + 1  # a bound on the values JSON holds, counted in C
    if values > MAX_VALUES:
        raise BaselineError(f"{path}: over {MAX_VALUES:,} values, not a kvtop baseline")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BaselineError(f"{path}: not UTF-8 text, not a kvtop baseline") from None
    try:
        return loads(text)
    except BaselineError as exc:
        raise BaselineError(f"{path}: {exc}") from None


def save(baseline: Baseline, spec: str, *, overwrite: bool = False) -> Path:
    """Write ``baseline`` atomically (a crash leaves the old file or none, never half)."""
    path = baseline_path(spec)
    if path.exists() and not overwrite:
        raise FileExistsError(f"baseline {spec!r} exists ({path}); --force replaces it")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(baseline.dumps())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@dataclass(frozen=True, slots=True)
class Listed:
    name: str
    path: Path
    baseline: Baseline | None
    error: str | None  # why it could not be read


def list_saved() -> list[Listed]:
    """Every ``*.json`` in the baselines folder, read (unreadable ones say why)."""
    folder = baselines_dir()
    found = []
    for path in sorted(folder.glob("*.json")):  # none where there is no folder
        try:
            found.append(Listed(path.stem, path, load(str(path)), None))
        except BaselineError as exc:
            found.append(Listed(path.stem, path, None, str(exc)))
    return found


def remove(spec: str) -> Path:
    path = baseline_path(spec)
    try:
        path.unlink()
    except FileNotFoundError:
        raise BaselineError(f"no baseline {spec!r} at {path}") from None
    except OSError as exc:
        raise BaselineError(f"{path}: {exc.strerror or exc}") from None
    return path
