"""
Runners: how the journal runs its blocking file work (fsyncs, renames, packs).

A runner takes a callable and returns a Deferred of its result. The server's
runner is its reactor's thread pool: the work runs off the reactor thread and
the Deferred fires back on it. L{InlineRunner} runs the work at once on the
calling thread and returns an already-fired Deferred; unit tests and offline
tools use it. Either way the journal takes the one same code path: only when
the Deferreds fire differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed

RunInThread = Callable[[Callable[[], Any]], Deferred[Any]]
"""Runs a blocking callable (off the reactor thread); its Deferred fires on the reactor thread."""


class InlineRunner:
    """
    A L{RunInThread} that runs each job now, on the calling thread: it
    returns a Deferred that has already fired with the job's result, or
    failed with the exception it raised.
    """

    __slots__ = ()

    def __call__(self, job: Callable[[], Any]) -> Deferred[Any]:
        """Run C{job} now; return a fired Deferred of its result (failed if it raised)."""
        try:
            result = job()
        except Exception:
            return fail()
        return succeed(result)


#: The shared L{InlineRunner} (it holds no state).
run_inline = InlineRunner()
