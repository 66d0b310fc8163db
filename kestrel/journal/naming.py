"""
The names of a queue's journal files, and moving dead files into an archive.

Files in the queue directory (see docs/journal.md): C{<q>} (current),
C{<q>.<ms>} (rotated, replayed in ascending timestamp order before C{<q>}),
C{<q>~~<ms>} (being written by a rewrite or pack) and C{<q>.<ms>.pack} (a
finished pack). Everything here is a pure function of names, a directory and
a clock reading, except L{archive_file}, which moves one file durably.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterable

from twisted.logger import Logger

_log = Logger(namespace="kestrel.journal.naming")

#: Marks a file being written (a rewrite or a pack): C{<q>~~<ms>}; deleted at replay.
TEMP_INFIX = "~~"
#: Ends a finished pack: C{<q>.<ms>.pack}.
PACK_SUFFIX = ".pack"


def list_names(path: str) -> list[str]:
    """Return the names in directory C{path}; a missing directory has none."""
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def timed_files(queue_name: str, names: Iterable[str]) -> list[tuple[int, bool, str]]:
    """Return C{(timestamp, is_pack, name)} of C{queue_name}'s rotated and pack files, sorted."""
    prefix = queue_name + "."
    out = []
    for name in names:
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        is_pack = rest.endswith(PACK_SUFFIX)
        if is_pack:
            rest = rest[:-len(PACK_SUFFIX)]
        if rest.isdigit() and rest.isascii():
            out.append((int(rest), is_pack, name))
    out.sort()
    return out


def packed_order(timed: Iterable[tuple[int, bool, str]]) -> list[str]:
    """
    Return the rotated files of C{timed} (as L{timed_files} returns them) in
    the order replay would read them once the pack rule has run, without
    running it: the last pack stands, under its C{.pack} name, for every file
    up to its timestamp (earlier packs included); the files after it follow.
    """
    out: list[str] = []
    for _, is_pack, name in timed:
        if is_pack:
            out.clear()
        out.append(name)
    return out


def unique_timestamp(now_ms: int, directory: str, prefix: str) -> int:
    """Return C{now_ms} or more: above every timestamp used after C{prefix} in C{directory}."""
    return _timestamp_above(now_ms, list_names(directory), prefix)


def _timestamp_above(now_ms: int, names: Iterable[str], prefix: str) -> int:
    """Return C{now_ms} or more: above every timestamp after C{prefix} in C{names}."""
    ts = now_ms
    for name in names:
        if name.startswith(prefix):
            rest = name[len(prefix):].split(".", 1)[0].split("~", 1)[0]
            if rest.isdigit() and rest.isascii():
                ts = max(ts, int(rest) + 1)
    return ts


def free_rotated_timestamp(queue_path: str, queue_name: str, now_ms: int) -> int:
    """
    Return C{now_ms} or more: a timestamp above every one in C{queue_name}'s
    rotated, pack and C{~~} file names in C{queue_path} (one listing), for
    which neither C{<q>.<ms>} nor C{<q>.<ms>.pack} exists.
    """
    names = list_names(queue_path)
    ts = max(_timestamp_above(now_ms, names, queue_name + "."),
             _timestamp_above(now_ms, names, queue_name + TEMP_INFIX))
    while True:
        path = os.path.join(queue_path, f"{queue_name}.{ts}")
        if not (os.path.lexists(path) or os.path.lexists(path + PACK_SUFFIX)):
            return ts
        ts += 1


def journal_queue_name(filename: str) -> str | None:
    """
    Return the queue that a journal file named C{filename} belongs to, or C{None}.

    C{<q>}, C{<q>.<digits>} and C{<q>.<digits>.pack} belong to C{<q>} (the
    same names replay reads); any other name, an empty C{<q>} included,
    belongs to no queue. C{~~} files are not considered here.
    """
    queue, dot, rest = filename.partition(".")
    if not queue:
        return None
    if not dot:
        return queue
    if rest.endswith(PACK_SUFFIX):
        rest = rest[:-len(PACK_SUFFIX)]
    if rest.isdigit() and rest.isascii():
        return queue
    return None


def archive_file(queue_path: str, queue_name: str, name: str, archive: str, now_ms: int,
                 fsync: Callable[[int], None],
                 fsync_dir: Callable[[str], None]) -> str | None:
    """
    Move journal file C{name} of C{queue_name} into C{archive} without ever losing it.

    The current file C{<q>} is archived as C{<q>.<ms>}. A name that is
    taken in the archive gets the next free timestamp. Same filesystem:
    rename, then fsync both directories. Another filesystem: copy to a
    C{~~} file, fsync it, rename it, fsync the archive, then delete the
    original and fsync the queue directory.

    @return: the archived file's path, or C{None} if C{name} was already gone.
    """
    os.makedirs(archive, exist_ok=True)
    src = os.path.join(queue_path, name)
    prefix = queue_name + "."
    if name.startswith(prefix):
        ts = int(name[len(prefix):].split(".", 1)[0])
    else:
        ts = unique_timestamp(now_ms, archive, prefix)
    while os.path.lexists(os.path.join(archive, f"{prefix}{ts}")):
        ts += 1
    target = os.path.join(archive, f"{prefix}{ts}")
    try:
        os.rename(src, target)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        temp = target + TEMP_INFIX + "copy"
        with open(src, "rb") as fin, open(temp, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1024 * 1024)
            fout.flush()
            fsync(fout.fileno())
        os.rename(temp, target)
        fsync_dir(archive)
        os.unlink(src)
        fsync_dir(queue_path)
    else:
        fsync_dir(archive)
        fsync_dir(queue_path)
    return target


def queue_names_in(path: str) -> set[str]:
    """
    Return the names of the queues with journal files in C{path}.

    Only regular files named C{<q>}, C{<q>.<digits>} or
    C{<q>.<digits>.pack} name a queue C{<q>}; C{~~} files (a rewrite or
    pack in progress, cleaned up by the replay of their queue) are
    passed over silently. Every other regular file is left untouched
    and logged as a warning naming it; subdirectories are passed over.
    """
    return set(queue_sizes_in(path))


def queue_sizes_in(path: str) -> dict[str, int]:
    """
    Return the bytes of journal (every file: current, rotated, packs) of
    each queue with journal files in C{path}, found and logged as
    L{queue_names_in} says.
    """
    names: dict[str, int] = {}
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return names
    for entry in entries:
        name = entry.name
        if entry.is_symlink():
            _log.warn("Ignoring symbolic link {file!r} in queue directory {path}: "
                      "journals are never followed out of it", file=name, path=path)
            continue
        if TEMP_INFIX in name or not entry.is_file():
            continue
        queue = journal_queue_name(name)
        if queue is None:
            _log.warn("Ignoring file {file!r} in queue directory {path}: not a journal file",
                      file=name, path=path)
        else:
            try:
                size = entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
            names[queue] = names.get(queue, 0) + size
    return names
