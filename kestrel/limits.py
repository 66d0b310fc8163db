"""
The process's file-descriptor limit: raised at start, and the share of it
that queues may hold.

Each queue with a journal keeps one file open (two for a moment while it
rotates), and each connection holds a socket. Queues may hold at most half
of the soft C{RLIMIT_NOFILE}, so that connections, rotations, packs and the
listeners always find a descriptor; a request that would create a queue past
that share is refused with one error line (L{kestrel.errors.TooManyQueues}).
"""

from __future__ import annotations

import contextlib
import errno
import resource
from collections.abc import Iterator

from kestrel.errors import TooManyQueues

__all__ = [
    "FD_SHARE_FOR_QUEUES", "check_room", "descriptors_for", "queue_fd_budget",
    "raise_open_file_limit",
]

#: The share of the soft file-descriptor limit that queues may hold.
FD_SHARE_FOR_QUEUES = 0.5

#: What an unlimited limit counts as (no system hands out more descriptors).
_UNLIMITED = 1 << 30


def _soft_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return _UNLIMITED if soft == resource.RLIM_INFINITY else soft


def raise_open_file_limit() -> tuple[int, int]:
    """
    Raise the soft C{RLIMIT_NOFILE} to the hard one (when the hard one is
    finite and higher) and return the (soft, hard) limits now in force.
    A refusal by the system leaves the limits as they were.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def queue_fd_budget() -> int:
    """How many queues the process may hold under its current soft descriptor limit."""
    return int(_soft_limit() * FD_SHARE_FOR_QUEUES)


def check_room(name: str, held: int, max_queues: int) -> None:
    """
    Refuse (L{TooManyQueues}) creating queue C{name} when the server already
    holds C{held} queues: at C{max_queues}, or at the descriptor budget.
    """
    if held >= max_queues:
        raise TooManyQueues(name, f"the server holds max_queues ({max_queues}) "
                            "queues; delete some or raise max_queues")
    budget = queue_fd_budget()
    if held >= budget:
        raise TooManyQueues(name, f"queues may hold {budget} file descriptors "
                            "(half of RLIMIT_NOFILE); delete some or raise the limit")


@contextlib.contextmanager
def descriptors_for(name: str) -> Iterator[None]:
    """
    Run the setup of queue C{name}: running out of file descriptors there
    (C{EMFILE}, C{ENFILE}) becomes L{TooManyQueues}; other errors pass.
    """
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        raise TooManyQueues(name, "no file descriptor is free; try again later") from e
