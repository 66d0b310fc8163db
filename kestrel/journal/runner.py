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
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

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


class SyncTurn:
    """
    Calls each function handed to L{call} once, after the current reactor turn.

    The first L{call} of a turn schedules one C{clock.callLater(0, ...)}: on
    any reactor that runs in the next C{runUntilCurrent}, after every event
    of the current poll was dispatched (under C{task.Clock}, at the next
    C{advance}). Then every function handed over until that moment runs, in
    the order given; those handed over while they run wait for the next
    turn. A function that raises is logged and does not stop the others.

    Journal files under C{sync_journal: always} use one shared C{SyncTurn}
    to start their fsync once per turn for every write made in it, and
    files under C{always} or a period to write the records of their durable
    adds once per turn (see L{kestrel.journal.syncfile.PeriodicSyncFile}).
    """

    __slots__ = ("_clock", "_calls", "_scheduled")

    _log = Logger()

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._calls: list[Callable[[], object]] = []
        self._scheduled = False

    def call(self, f: Callable[[], object]) -> None:
        """Call C{f()} once, after the events of the current reactor turn."""
        self._calls.append(f)
        if not self._scheduled:
            self._scheduled = True
            self._clock.callLater(0, self._run)

    def _run(self) -> None:
        self._scheduled = False
        calls, self._calls = self._calls, []
        for f in calls:
            try:
                f()
            except Exception:
                self._log.failure("end-of-turn call {call} failed", call=f)
