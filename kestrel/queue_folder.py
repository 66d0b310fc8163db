"""
The queue folder: created and checked at start, and no journal path in it
that is anything but a regular file (a symbolic link is never followed).
"""

from __future__ import annotations

import os

from twisted.logger import Logger

from kestrel.errors import ConfigError, InvalidQueueName

__all__ = ["ensure_queue_path", "refuse_foreign_journal"]

_log = Logger(namespace="kestrel.collection")


def ensure_queue_path(path: str, mode: int = 0o700) -> None:
    """
    Create the queue folder C{path} (with C{mode}) if missing; warn if it is
    open to other users; raise L{ConfigError} if it cannot be written.
    """
    try:
        if not os.path.lexists(path):
            os.makedirs(path, mode=mode, exist_ok=True)
            os.chmod(path, mode)
        elif os.stat(path).st_mode & 0o077 & ~mode:
            _log.warn("queue_path {path} is open to other users (mode {mode:o}); "
                      "chmod {want:o} it", path=path,
                      mode=os.stat(path).st_mode & 0o777, want=mode)
    except OSError as e:
        raise ConfigError([f"queue_path: Inaccessible queue path {path!r}: {e}"]) from e
    if not (os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)):
        raise ConfigError([f"queue_path: Inaccessible queue path {path!r}: "
                           "Must be a directory and writable"])


def refuse_foreign_journal(path: str, name: str) -> None:
    """
    Refuse (L{InvalidQueueName}) queue C{name} when its journal path in the
    queue folder C{path} is a symbolic link or anything but a regular file:
    nothing is ever read or written through it.
    """
    journal = os.path.join(path, name)
    if os.path.islink(journal) or (os.path.lexists(journal) and not os.path.isfile(journal)):
        _log.warn("Refusing queue {queue}: {path} is a symbolic link or not a "
                  "regular file", queue=name, path=journal)
        raise InvalidQueueName(f"{name}: its journal path is not a regular file")
