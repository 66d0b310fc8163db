"""
FileChores: file work handed off the reactor thread with nothing reported back.

Some journal work must leave the reactor thread only because the kernel may
make it wait (the last C{close} of a replaced journal file frees its blocks,
which on a file system mounted with C{discard} waits for the device), and the
reactor needs no word of when it is done. A reactor thread-pool job
(C{deferToThreadPool}) costs the reactor more than such work does: a Deferred,
a context, the pool's locks, a wake-up of the reactor when it ends and a
callback there, and each time the pool's thread runs Python it holds the GIL
that the reactor waits for. A chore costs the calling thread one
C{SimpleQueue.put}; one thread of its own runs the chores in order, each
between two blocking calls, and never calls back.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from twisted.logger import Logger

Chore = Callable[[], object]
"""A job of a L{FileChores}: it reports nothing back, and changes shared state only under locks."""

_STOP = object()


class FileChores:
    """
    Runs chores (L{Chore}) one at a time, in the order handed over, on one
    daemon thread started with the first. A chore that raises is logged,
    and the next one runs. L{stop} lets the thread finish what it was given
    and end; a chore handed over after that starts a new thread.
    """

    _log = Logger()

    def __init__(self, name: str = "kestrel-file-chores") -> None:
        self._name = name
        # Each thread has a queue of its own, so that one still finishing
        # after a stop never takes a chore of the next.
        self._chores: queue.SimpleQueue[object] | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def __call__(self, chore: Chore) -> None:
        """Hand C{chore} to the thread; return at once."""
        chores = self._chores
        if chores is None:
            chores = self._start()
        chores.put(chore)

    def _start(self) -> queue.SimpleQueue[object]:
        with self._lock:
            if self._chores is None:
                chores: queue.SimpleQueue[object] = queue.SimpleQueue()
                thread = threading.Thread(target=self._run, args=(chores,), name=self._name,
                                          daemon=True)
                thread.start()
                self._chores, self._thread = chores, thread
            return self._chores

    def _run(self, chores: queue.SimpleQueue[object]) -> None:
        get = chores.get
        while True:
            chore = get()
            if chore is _STOP:
                return
            try:
                chore()  # type: ignore[operator]
            except Exception:
                self._log.failure("A file chore failed")

    def join(self, timeout: float | None = None) -> bool:
        """Wait until every chore handed over so far has run; whether they had within C{timeout}."""
        chores = self._chores
        if chores is None:
            return True
        done = threading.Event()
        chores.put(done.set)
        return done.wait(timeout)

    def stop(self, timeout: float | None = None) -> bool:
        """
        Let the thread run the chores handed over so far, then end it; whether it
        ended within C{timeout} (it is a daemon thread: one still busy does not
        hold up the process's exit).
        """
        with self._lock:
            chores, thread = self._chores, self._thread
            self._chores = self._thread = None
        if chores is None or thread is None:
            return True
        chores.put(_STOP)
        thread.join(timeout)
        return not thread.is_alive()
