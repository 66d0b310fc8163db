"""
The reactor txkestrel runs on: Twisted's epoll reactor with a leaner dispatch.

One request at a time, a queue server wakes up once per request, so the
reactor's cost per wake-up is paid per request. Twisted's L{EPollReactor}
hands every ready descriptor to C{_doReadOrWrite} inside
L{twisted.python.log.callWithLogger}, which copies and pushes a legacy log
context (a dictionary naming the connection) around every read: about 1.7 us of
Python per event on this project's machines, more than the rest of the
reactor's loop. L{KestrelReactor} is that reactor with one change: a
descriptor that is only readable (C{EPOLLIN} and nothing else, the usual
event) is read directly, with the same error handling, and the same
disconnection handling as Twisted's. Every other event (writable, hung up, in
error) still goes through Twisted's own code, unchanged. Its main loop also
sets up its error handler once per run instead of once per turn, and a turn
with nothing to run (no call from another thread, no delayed call added or
due, no stop under way: a request served, the usual turn) takes its poll
timeout from the earliest delayed call itself, where Twisted's loop calls
C{runUntilCurrent} and C{timeout} every turn (about 0.35 us of Python a turn
on this project's machines); any other turn calls both, as Twisted does.

What differs, and nothing else: Twisted's legacy log context (the C{system}
of events logged through C{twisted.python.log}) is not set around every read,
only while a read's error is logged (with the connection's name as its
C{system}, as before) and while a connection is disconnected. txkestrel logs
through C{twisted.logger}, which does not read that context.

The C{kestrel} server installs this reactor unless a reactor was chosen with
twistd's C{--reactor} option (C{twistd --reactor epoll -n kestrel} runs it
on Twisted's own); it is also a reactor plugin, C{--reactor kestrel}, for
any other twistd application. Twisted's own reactor test suites run against
it in C{tests/unit/test_reactor.py}.
"""

from __future__ import annotations

import sys
from typing import Any

from twisted.internet.epollreactor import EPollReactor
from twisted.internet.posixbase import _NO_FILEDESC
from twisted.logger import Logger
from twisted.python import log

_log = Logger()

#: The longest poll timeout (seconds), as Twisted's C{ReactorBase.timeout}
#: caps it: epoll_wait takes a signed 32-bit count of milliseconds.
_LONGEST_TIMEOUT = 2147483

#: An event that is only "readable" (EPollReactor's C{_POLL_IN}, read here
#: once: a class attribute read through the reactor is not specialized).
_POLL_IN = EPollReactor._POLL_IN


class KestrelReactor(EPollReactor):
    """
    Twisted's epoll reactor, dispatching readable descriptors with fewer layers.

    It promises what L{EPollReactor} promises (it is one, and passes Twisted's
    reactor tests) but the legacy log context during reads (see the module),
    at a lower CPU cost per event.
    """

    def doPoll(self, timeout: float | None) -> None:  # noqa: N802 - Twisted's name
        """Wait up to C{timeout} seconds (forever if None) for events and dispatch them."""
        try:
            events = self._poller.poll(-1 if timeout is None else timeout,
                                       len(self._selectables))
        except InterruptedError:
            return
        selectables = self._selectables
        only_readable = _POLL_IN
        for fd, event in events:
            selectable = selectables.get(fd)
            if selectable is None:
                continue
            if event != only_readable:
                log.callWithLogger(selectable, self._doReadOrWrite, selectable, fd, event)
                continue
            try:
                why = _NO_FILEDESC if selectable.fileno() == -1 else selectable.doRead()
            except BaseException:
                why = sys.exc_info()[1]
                log.err(None, "Unhandled error while reading", system=_prefix(selectable))
            if why:
                log.callWithLogger(selectable, self._disconnectSelectable, selectable, why, True)

    doIteration = doPoll  # noqa: N815 - Twisted's name

    def mainLoop(self) -> None:  # noqa: N802 - Twisted's name
        """
        Run the reactor's turns until it stops; log (and survive) an unexpected error.

        Each turn runs what Twisted's loop runs (C{runUntilCurrent}, then a
        poll until the next delayed call is due) but skips both calls when
        nothing is due: then the poll's timeout is the earliest delayed
        call's time from now (C{None}, none pending), as C{timeout} would find.
        """
        while self._started:
            try:
                while self._started:
                    pending = self._pendingTimedCalls
                    now = self.seconds()
                    if (self.threadCallQueue or self._newTimedCalls or self._justStopped
                            or (pending and pending[0].time <= now)):
                        self.runUntilCurrent()
                        timeout = self.timeout()
                    elif pending:
                        timeout = pending[0].time - now
                        if timeout > _LONGEST_TIMEOUT:
                            timeout = _LONGEST_TIMEOUT
                    else:
                        timeout = None
                    self.doIteration(self.running and timeout)
            except BaseException:
                _log.failure("Unexpected error in main loop")
        _log.info("Main loop terminated.")


def _prefix(selectable: Any) -> str:
    """The descriptor's log prefix (the connection's name), as Twisted's dispatch finds it."""
    try:
        return str(selectable.logPrefix())
    except BaseException:
        return "(buggy logPrefix method)"


def install() -> KestrelReactor:
    """Install a L{KestrelReactor} as the global reactor and return it."""
    from twisted.internet.main import installReactor

    reactor = KestrelReactor()
    installReactor(reactor)
    return reactor


def install_unless_chosen() -> bool:
    """
    Install L{KestrelReactor} if no reactor is installed yet; whether it did.

    A reactor is already installed when the user chose one (twistd's
    C{--reactor}) or something imported C{twisted.internet.reactor}: that
    one is kept.
    """
    if "twisted.internet.reactor" in sys.modules:
        return False
    install()
    return True
