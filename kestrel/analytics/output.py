"""
The output folder: refused when it overlaps an input, written safely.

Spark-free. L{check_output} runs before any work: an C{--out} that is, holds
or lies inside an input folder is refused, and so is an output folder that
already holds an entry with one of the tool's names that the tool did not
write. L{Staging} gives the job a fresh temporary folder under C{OUT}; when
every table is written, L{Staging.commit} moves them into place and replaces
only entries that the marker file C{OUT/.kestrel-analyze-owned} lists as the
tool's own. Nothing else in C{OUT} is ever deleted.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import uuid
from collections.abc import Iterable, Sequence

from kestrel.analytics.layout import LayoutError, is_local, local_path

#: The file in C{OUT} that lists the entries kestrel-analyze wrote there.
MARKER = ".kestrel-analyze-owned"
#: Every entry the tool may write into C{OUT}.
OUTPUT_NAMES = ("events", "files", "flow", "backlog", "time_in_queue", "expiry",
                "summary.json", "report.html")
#: Temporary folders under C{OUT} start with this.
STAGING_PREFIX = ".kestrel-analyze-tmp-"


def _norm(path: str) -> str:
    """Return a comparable form of a local path or a URI (no trailing slash)."""
    if is_local(path):
        return os.path.realpath(local_path(path))
    scheme, _, rest = path.partition("://")
    return scheme.lower() + "://" + posixpath.normpath(rest).rstrip("/")


def _inside(child: str, parent: str) -> bool:
    sep = "/"
    return child == parent or child.startswith(parent.rstrip(sep) + sep)


def check_overlap(out: str, inputs: Iterable[str]) -> None:
    """
    Refuse an output folder that is, holds, or lies inside an input folder.

    @raise LayoutError: naming the input it overlaps.
    """
    o = _norm(out)
    for folder in inputs:
        i = _norm(folder)
        if o == i:
            raise LayoutError(f"--out {out!r} is the input folder {folder!r}; "
                              "choose a folder outside every input")
        if _inside(o, i):
            raise LayoutError(f"--out {out!r} is inside the input folder {folder!r}; "
                              "choose a folder outside every input")
        if _inside(i, o):
            raise LayoutError(f"--out {out!r} contains the input folder {folder!r}; "
                              "choose a folder outside every input")


def read_marker(folder: str) -> set[str]:
    """Return the entries the marker in local folder C{folder} lists (empty if none)."""
    try:
        with open(os.path.join(folder, MARKER), encoding="utf-8") as fh:
            got = json.load(fh)
    except FileNotFoundError:
        return set()
    except (OSError, ValueError):
        return set()
    return {n for n in got.get("owned", []) if isinstance(n, str) and n in OUTPUT_NAMES}


def check_output(out: str, inputs: Sequence[str]) -> None:
    """
    Check C{--out} before any work starts.

    @raise LayoutError: it overlaps an input, is a file, cannot be created,
        or holds an entry named like an output that the tool did not write.
    """
    check_overlap(out, inputs)
    if not is_local(out):
        return
    folder = local_path(out)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise LayoutError(f"--out {out!r} is a file, not a folder")
    if not os.path.isdir(folder):
        parent = os.path.dirname(os.path.abspath(folder))
        while parent and not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.access(parent, os.W_OK):
            raise LayoutError(f"--out {out!r} cannot be created: {parent!r} is not writable")
        return
    if not os.access(folder, os.W_OK | os.X_OK):
        raise LayoutError(f"--out {out!r} is not writable")
    owned = read_marker(folder)
    for name in OUTPUT_NAMES:
        if os.path.lexists(os.path.join(folder, name)) and name not in owned:
            raise LayoutError(
                f"--out {out!r} already holds {name!r}, which kestrel-analyze did not write; "
                "move it away or choose another --out")


class Staging:
    """
    A fresh temporary folder under a local C{OUT}, moved into place by L{commit}.

    @ivar path: the temporary folder the job writes its outputs into.
    """

    def __init__(self, out: str) -> None:
        self.out = local_path(out)
        os.makedirs(self.out, exist_ok=True)
        self.path = os.path.join(self.out, STAGING_PREFIX + uuid.uuid4().hex[:12])
        os.makedirs(self.path)

    def commit(self) -> list[str]:
        """
        Move every staged entry into C{OUT}; return their names.

        An entry already in C{OUT} is replaced only if the marker lists it;
        otherwise L{LayoutError} is raised and the staged outputs stay where
        they are. The marker is rewritten to list what C{OUT} now holds of ours.
        """
        staged = sorted(n for n in os.listdir(self.path) if n in OUTPUT_NAMES)
        owned = read_marker(self.out)
        for name in staged:
            target = os.path.join(self.out, name)
            if os.path.lexists(target) and name not in owned:
                raise LayoutError(
                    f"{target!r} appeared while the job ran and kestrel-analyze did not write "
                    f"it; the results are in {self.path!r}")
        trash = os.path.join(self.path, ".replaced")
        os.makedirs(trash)
        for name in staged:
            target = os.path.join(self.out, name)
            if os.path.lexists(target):
                os.rename(target, os.path.join(trash, name))
            os.rename(os.path.join(self.path, name), target)
            owned.add(name)
        self._write_marker(owned)
        shutil.rmtree(self.path)
        return staged

    def abandon(self) -> None:
        """Remove the temporary folder (the job failed); C{OUT}'s entries stay untouched."""
        shutil.rmtree(self.path, ignore_errors=True)

    def _write_marker(self, owned: set[str]) -> None:
        tmp = os.path.join(self.path, MARKER)
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"owned": sorted(owned),
                       "note": "entries written by kestrel-analyze; it replaces only these"},
                      fh, indent=1)
        os.replace(tmp, os.path.join(self.out, MARKER))
