"""
Which journal files an analysis reads, and in what order.

This module is Spark-free. It turns folder listings into a L{Plan}: for each
server and queue, the files whose records count, in replay order, with the
time bounds the scanner uses to bracket records that carry no timestamp.

Naming (Kestrel's): ``<q>`` is the live file, ``<q>.<ms>`` a
rotated file, ``<q>.<ms>.pack`` a pack, and any name holding ``~~`` is a
temporary file (skipped). The pack rule is the server's replay rule: when a
queue has packs, the newest pack (timestamp P) replaces every ``<q>.<ms>``
with ms <= P and every older pack; those files are listed as skipped, never
counted.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Sequence

import attrs

#: File kinds, in the order a queue's files replay at equal timestamps.
ROTATED = "rotated"
PACK = "pack"
LIVE = "live"


#: Added to a live file's modification time to make it an upper bound of its
#: last write. Linux stamps files from a coarse clock that lags the real time
#: by up to one scheduler tick (10 ms at the lowest tick rate, 100 Hz), and
#: the modification time is read to the millisecond, rounding down: a write at
#: time t can leave an mtime as early as t - 11 ms (7.4 ms was measured).
MTIME_SLACK_MS = 20


class LayoutError(ValueError):
    """The inputs cannot be analysed as given (a clear message says why)."""


@attrs.frozen
class Listing:
    """
    One regular file found in an input folder.

    @ivar server: the server the folder belongs to.
    @ivar name: the file's base name.
    @ivar path: a local path or a Hadoop file-system URI.
    @ivar size: its length in bytes.
    @ivar mtime_ms: its modification time, epoch milliseconds.
    """

    server: str
    name: str
    path: str
    size: int
    mtime_ms: int
    archive: bool = False


@attrs.frozen
class JournalFile:
    """
    A journal file whose records are counted.

    @ivar seq: the file's position in its queue's replay order (0 first).
    @ivar ts_ms: the timestamp in the name (C{None} for the live file).
    @ivar start_ms: no record in the file was written before this time
        (the previous file's end), or C{None} if unknown.
    @ivar end_ms: no record in the file was written after this time (the
        rotation timestamp, or the modification time of the live file), or
        C{None} if unknown.
    @ivar archive: the file comes from an archive folder: its records count
        as traffic only, never in what a restart would hold.
    @ivar bound_ms: if the file turns out to be a snapshot (it starts with
        SAVE_XID), no re-emitted item in it was added after this time, and
        fillers were added at or after it (C{None}: unknown).
    @ivar bound_exact: C{bound_ms} is known to separate the snapshot's items
        from the adds written after it: it comes from the archive (the file
        the pack or rewrite rotated away) or from a C{.pack} name. Otherwise
        it is the file's own timestamp, which a rewritten live file that was
        rotated later also has: every add of its snapshot may be a client's.
    """

    server: str
    queue: str
    name: str
    path: str
    size: int
    kind: str
    ts_ms: int | None
    seq: int
    start_ms: int | None
    end_ms: int | None
    archive: bool = False
    bound_ms: int | None = None
    bound_exact: bool = False

    def to_dict(self) -> dict[str, object]:
        """Return the file as a JSON-able dict (see L{from_dict})."""
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> JournalFile:
        """Rebuild a file from L{to_dict}'s output."""
        return cls(**d)  # type: ignore[arg-type]


@attrs.frozen
class SkippedFile:
    """A file in an input folder that is not read, and why."""

    server: str
    name: str
    path: str
    size: int
    reason: str


@attrs.frozen
class Plan:
    """Every file to read (in replay order per queue) and every file skipped."""

    files: tuple[JournalFile, ...]
    skipped: tuple[SkippedFile, ...]

    @property
    def total_bytes(self) -> int:
        """Return the number of bytes the plan reads."""
        return sum(f.size for f in self.files)

    def queues(self) -> list[tuple[str, str]]:
        """Return every (server, queue) with at least one counted file, sorted."""
        return sorted({(f.server, f.queue) for f in self.files})


def parse_input(arg: str) -> tuple[str, str]:
    """
    Split a command-line input into C{(server, path)}.

    C{name=path} names the server explicitly; otherwise the server is the
    folder's last path component (C{/data/kestrel1/} -> C{kestrel1}).

    @raise LayoutError: the server name would be empty.
    """
    if "=" in arg:
        name, _, path = arg.partition("=")
        if name and "/" not in name and ":" not in name:
            if not path:
                raise LayoutError(f"input {arg!r} names server {name!r} but no folder")
            return name, path
    path = arg
    server = path.rstrip("/").rsplit("/", 1)[-1]
    if not server or server.endswith(":"):
        raise LayoutError(f"cannot name a server after {arg!r}; use NAME=PATH")
    return server, path


def is_local(path: str) -> bool:
    """Return whether C{path} is a local path (no scheme, or C{file:})."""
    return "://" not in path or path.startswith("file://")


def local_path(path: str) -> str:
    """Return C{path} without a C{file://} scheme."""
    return path[len("file://"):] if path.startswith("file://") else path


def list_local(server: str, folder: str, archive: bool = False) -> list[Listing]:
    """
    List the regular files directly inside a local folder, checking it first.

    Sub-folders are ignored, as the server ignores them.

    @raise LayoutError: the folder does not exist, is not a folder, cannot
        be read, is empty, or holds no journal file (one line says which).
    """
    folder = local_path(folder)
    if not os.path.exists(folder):
        raise LayoutError(f"input folder {folder!r} does not exist")
    if not os.path.isdir(folder):
        raise LayoutError(f"input {folder!r} is not a folder")
    found = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if not entry.is_file(follow_symlinks=True):
                    continue
                st = entry.stat()
                if not os.access(entry.path, os.R_OK):
                    raise LayoutError(f"journal file {entry.path!r} is not readable")
                found.append(Listing(server, entry.name, os.path.abspath(entry.path),
                                     st.st_size, st.st_mtime_ns // 1_000_000, archive))
    except PermissionError:
        raise LayoutError(f"input folder {folder!r} is not readable") from None
    except OSError as e:
        raise LayoutError(f"input folder {folder!r} cannot be listed: {e.strerror}") from None
    check_listing(folder, found)
    return found


def check_listing(folder: str, found: Sequence[Listing]) -> None:
    """
    Refuse a folder that holds no file, or no journal file.

    @raise LayoutError: naming the folder and what it holds instead.
    """
    if not found:
        raise LayoutError(f"input folder {folder!r} is empty: it holds no journal files")
    if not any(isinstance(classify(f.name), tuple) for f in found):
        names = ", ".join(sorted(f.name for f in found)[:3]) + (", ..." if len(found) > 3 else "")
        raise LayoutError(f"input folder {folder!r} holds no journal files "
                          f"({len(found)} other file(s): {names})")


def classify(name: str) -> tuple[str, str, int | None] | str:
    """
    Classify a file name.

    @return: C{(queue, kind, ts_ms)} for a journal file, or a string saying
        why the file is skipped.
    """
    if "~~" in name:
        return "temporary file (~~)"
    queue, dot, rest = name.partition(".")
    if not queue:
        return "not a journal file name"
    if not dot:
        return queue, LIVE, None
    parts = rest.split(".")
    if not parts[0].isdigit():
        return "not a journal file name"
    if len(parts) == 1:
        return queue, ROTATED, int(parts[0])
    if len(parts) == 2 and parts[1] == "pack":
        return queue, PACK, int(parts[0])
    return "not a journal file name"


def plan_files(listings: Iterable[Listing]) -> Plan:
    """
    Decide which files count and in which order, applying the pack rule.

    Per (server, queue), live folders: the newest pack P replaces every
    rotated file with timestamp <= P and every older pack; the rest replays
    by timestamp, then the live file. Archive folders (C{Listing.archive})
    hold dead files: every journal file in them counts, by timestamp, as
    traffic only. A file that starts with SAVE_XID is a snapshot (a pack or
    a rewrite); its C{bound_ms} is the newest archived timestamp of the queue
    at or before its own when the server's archive is given, else its own
    timestamp.

    @raise LayoutError: two folders of one server and role hold a file of the
        same name (which copy counts would be a guess).
    """
    by_queue: dict[tuple[str, str, bool], list[tuple[Listing, str, int | None]]] = \
        defaultdict(list)
    skipped: list[SkippedFile] = []
    seen: dict[tuple[str, bool, str], str] = {}
    for listing in listings:
        key = (listing.server, listing.archive, listing.name)
        if key in seen:
            raise LayoutError(
                f"server {listing.server!r} has two files named {listing.name!r}: "
                f"{seen[key]!r} and {listing.path!r}; give the folders different server names")
        seen[key] = listing.path
        got = classify(listing.name)
        if isinstance(got, str):
            skipped.append(SkippedFile(listing.server, listing.name, listing.path,
                                       listing.size, got))
            continue
        queue, kind, ts = got
        if listing.archive and kind == LIVE:
            kind = ROTATED  # an archive holds dead files only; a bare name has no timestamp
        by_queue[(listing.server, queue, listing.archive)].append((listing, kind, ts))

    archived_ts: dict[tuple[str, str], list[int]] = defaultdict(list)
    for (server, queue, archive), entries in by_queue.items():
        if archive:
            archived_ts[(server, queue)].extend(ts for _, _, ts in entries if ts is not None)

    files: list[JournalFile] = []
    for (server, queue, archive), entries in sorted(by_queue.items()):
        packs = [ts for _, kind, ts in entries if kind == PACK] if not archive else []
        newest_pack = max(packs) if packs else None  # type: ignore[type-var]
        kept: list[tuple[Listing, str, int | None]] = []
        for listing, kind, ts in entries:
            if newest_pack is not None and kind != LIVE and ts is not None:
                if ts < newest_pack or (ts == newest_pack and kind != PACK):
                    skipped.append(SkippedFile(server, listing.name, listing.path, listing.size,
                                               f"replaced by pack {queue}.{newest_pack}.pack"))
                    continue
            kept.append((listing, kind, ts))
        kept.sort(key=_replay_key)
        previous_end: int | None = None
        history = sorted(archived_ts.get((server, queue), []))
        for seq, (listing, kind, ts) in enumerate(kept):
            end = listing.mtime_ms + MTIME_SLACK_MS if kind == LIVE else ts
            bound = ts
            exact = kind == PACK
            if history and not archive and kind != PACK:
                older = [t for t in history if ts is None or t <= ts]
                bound = older[-1] if older else ts
                exact = bool(older)
            files.append(JournalFile(server, queue, listing.name, listing.path, listing.size,
                                     kind, ts, seq, previous_end, end, archive, bound, exact))
            previous_end = end if previous_end is None or end is None else max(previous_end, end)
    skipped.sort(key=lambda s: (s.server, s.name))
    return Plan(tuple(files), tuple(skipped))


def _replay_key(entry: tuple[Listing, str, int | None]) -> tuple[int, int, str]:
    listing, kind, ts = entry
    if kind == LIVE:
        return (1, 0, listing.name)
    return (0, ts or 0, listing.name)


def plan_local(inputs: Sequence[tuple[str, str]],
               archives: Sequence[tuple[str, str]] = ()) -> Plan:
    """Plan local folders: live C{(server, folder)} pairs, then archive folders."""
    listings: list[Listing] = []
    for server, folder in inputs:
        listings.extend(list_local(server, folder))
    for server, folder in archives:
        listings.extend(list_local(server, folder, archive=True))
    return plan_files(listings)
