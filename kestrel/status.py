"""
Server status: the availability level (Up, WriteAvoid, ReadOnly, Quiescent,
Down), its persistence in the status file, and the grace period that delays a
stricter level (Kestrel's C{ServerStatus}; C{docs/config.md}, "Server status").

Two statuses are tracked:

 - the I{reported} status (L{ServerStatus.status}): what C{status} commands,
   stats and ZooKeeper see; it changes as soon as a change is accepted;
 - the I{enforced} status (L{ServerStatus.enforced}): what
   L{ServerStatus.blocks_reads} and L{ServerStatus.blocks_writes} obey. A
   stricter change is enforced only after the grace period; a looser or equal
   one at once.

Time comes from the injected C{clock}; nothing here touches a socket.
"""

from __future__ import annotations

import enum
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from kestrel.errors import ForbiddenStatus, KestrelError, UnknownStatus


class StatusChangeRejectedError(KestrelError):
    """
    A stricter-or-equal status change asked for while another stricter change
    is still waiting for its grace period; the status is unchanged.

    C{current} is the (reported) status that stays in force.
    """

    def __init__(self, current: Status, requested: Status) -> None:
        super().__init__(
            f"Status change to {requested.display_name} rejected: "
            f"change to {current.display_name} is still in its grace period"
        )
        self.current = current
        self.requested = requested


class Status(enum.Enum):
    """
    A server availability level, with Kestrel's strictness and what it blocks.

    C{display_name} is Kestrel's name (C{Up}, C{ReadOnly}, ...), written to the
    status file; C{wire_name} is its upper-case form (C{UP}, C{READONLY}, ...)
    used in replies.
    """

    UP = ("Up", 1, False, False, False)
    WRITE_AVOID = ("WriteAvoid", 2, False, False, False)
    READ_ONLY = ("ReadOnly", 3, False, True, True)
    QUIESCENT = ("Quiescent", 4, True, True, True)
    DOWN = ("Down", 100, True, True, False)

    def __init__(
        self,
        display_name: str,
        strictness: int,
        blocks_reads: bool,
        blocks_writes: bool,
        graceful_shutdown: bool,
    ) -> None:
        self.display_name = display_name
        self.strictness = strictness
        self.blocks_reads = blocks_reads
        self.blocks_writes = blocks_writes
        self.graceful_shutdown = graceful_shutdown

    @property
    def wire_name(self) -> str:
        """The upper-case name sent to clients: C{UP}, C{WRITEAVOID}, C{READONLY}, ..."""
        return self.display_name.upper()

    def stricter_than(self, other: Status) -> bool:
        """Return whether this level restricts more than C{other}."""
        return self.strictness > other.strictness

    def __str__(self) -> str:
        return self.display_name


_BY_NAME = {s.wire_name: s for s in Status}


def parse_status(name: str | None) -> Status:
    """
    Return the level named by C{name}, case-insensitively (C{down} included).

    Surrounding whitespace is ignored. Raises L{UnknownStatus} for any other
    name, and for C{None} or anything that is not a string.
    """
    if not isinstance(name, str):
        raise UnknownStatus(f"Unknown status: expected a name, got {name!r}")
    status = _BY_NAME.get(name.strip().upper())
    if status is None:
        raise UnknownStatus(
            f"Unknown status {name!r}: expected one of up, readonly, quiescent, writeavoid"
        )
    return status


def parse_settable_status(name: str | Status | None) -> Status:
    """
    Return the level named by C{name} if a client or config may set it.

    Raises L{UnknownStatus} for an unknown name and L{ForbiddenStatus} for
    C{down} (only a shutdown goes down).
    """
    status = name if isinstance(name, Status) else parse_status(name)
    if status is Status.DOWN:
        raise ForbiddenStatus("Status Down may not be set; use Quiescent")
    return status


#: A status listener: called with (old, new) around every accepted change.
StatusListener = Callable[[Status, Status], None]


class ServerStatus:
    """
    The server's status, persisted in C{status_file} and changed by the rules
    of Kestrel's C{ServerStatus}.

    The status file is read when the object is created: a parsable first line
    sets the status at once (no grace period); a missing, unreadable or
    unparsable file leaves C{default_status}. Every accepted change made by
    L{set_status} rewrites the file atomically (temporary file, fsync,
    rename, fsync of the directory). C{status_file=None} keeps the status in
    memory only.
    """

    _log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        status_file: str | os.PathLike[str] | None,
        default_status: Status | str = Status.UP,
        grace_period: float = 0.0,
    ) -> None:
        if grace_period < 0:
            raise ValueError(f"grace_period must not be negative, got {grace_period!r}")
        self._clock = clock
        self._status_file = None if status_file is None else Path(status_file)
        self._default = parse_settable_status(default_status)
        self._grace_period = float(grace_period)
        self._status = self._default
        #: Whether reads (get, peek, monitor) are refused now (kept with L{enforced}).
        self.blocks_reads = False
        #: Whether writes (set, put, flush, delete, flush_expired, ...) are refused now.
        self.blocks_writes = False
        self._enforced = self._default
        self._pending: IDelayedCall | None = None
        self._listeners: list[StatusListener] = []
        self._load()

    @property
    def status(self) -> Status:
        """The reported status (what clients, stats and ZooKeeper are told)."""
        return self._status

    @property
    def enforced(self) -> Status:
        """The status whose restrictions apply now (it lags during a grace period)."""
        return self._enforced

    @property
    def change_pending(self) -> bool:
        """Whether a stricter status is reported but waiting for its grace period."""
        return self._pending is not None

    @property
    def _enforced(self) -> Status:
        return self._enforced_status

    @_enforced.setter
    def _enforced(self, status: Status) -> None:
        # (the flags are read per request: attributes, not properties)
        self._enforced_status = status
        self.blocks_reads = status.blocks_reads
        self.blocks_writes = status.blocks_writes

    @property
    def graceful_shutdown(self) -> bool:
        """Whether the enforced status asks queues to close gracefully (rewrite journals)."""
        return self._enforced.graceful_shutdown

    @property
    def readable(self) -> float:
        """The C{status/readable} gauge: 1.0 unless the reported status blocks reads."""
        return 0.0 if self._status.blocks_reads else 1.0

    @property
    def writeable(self) -> float:
        """The C{status/writeable} gauge: 1.0 unless the reported status blocks writes."""
        return 0.0 if self._status.blocks_writes else 1.0

    def add_listener(self, listener: StatusListener) -> None:
        """
        Call C{listener(old, new)} on every accepted change of the reported status.

        A stricter change calls listeners before it is accepted, a looser one
        after. If a listener raises, the change is undone (the previous
        status is restored, nothing is persisted) and the exception reaches
        the caller of L{set_status}. Changes to the same status call nobody.
        """
        self._listeners.append(listener)

    def remove_listener(self, listener: StatusListener) -> None:
        """Stop calling C{listener}; raises C{ValueError} if it was not added."""
        self._listeners.remove(listener)

    def set_status(self, name: str | Status) -> Status:
        """
        Ask for status C{name} (case-insensitive) and return the new reported status.

        A looser or equal status is enforced at once and cancels a pending
        change; a stricter one is reported at once and enforced after the
        grace period. Raises L{UnknownStatus}, L{ForbiddenStatus} (C{down}),
        L{StatusChangeRejectedError} when a stricter change is still pending and
        this one is not looser than the reported status, or whatever a
        listener or the status file write raised (the status is then
        unchanged).
        """
        new = parse_settable_status(name)
        old = self._status
        if self._pending is not None and not old.stricter_than(new):
            self._log.warn(
                "status change from {old} to {new} rejected: grace period pending",
                old=old.display_name, new=new.display_name,
            )
            raise StatusChangeRejectedError(old, new)
        stricter = new.stricter_than(old)
        if stricter:
            self._call_listeners(old, new)
            self._persist_or_revert(old, new)
            self._status = new
            if self._grace_period > 0:
                self._pending = self._clock.callLater(self._grace_period, self._grace_expired, new)
            else:
                self._enforced = new
        else:
            saved = self._enforced
            self._status = new
            self._enforced = new
            try:
                if new is not old:
                    self._call_listeners(old, new)
            except BaseException:
                self._status, self._enforced = old, saved
                raise
            try:
                self._persist_or_revert(old, new)
            except BaseException:
                self._status, self._enforced = old, saved
                raise
            self._cancel_pending()
        self._log.info(
            "status switched to {new} (previously {old})",
            old=old.display_name, new=new.display_name, enforced=self._enforced.display_name,
        )
        return self._status

    def shutdown(self) -> None:
        """
        Go Down at once without persisting: cancel any pending change, report
        and enforce Down.

        Listeners hear of it (their failures are logged, not raised).
        """
        self._cancel_pending()
        old = self._status
        if old is Status.DOWN:
            return
        self._status = self._enforced = Status.DOWN
        for listener in list(self._listeners):
            try:
                listener(old, Status.DOWN)
            except Exception:
                self._log.failure("status listener failed on shutdown", old=old.display_name)
        self._log.info("status switched to Down for shutdown (previously {old})",
                       old=old.display_name)

    # -- internals

    def _call_listeners(self, old: Status, new: Status) -> None:
        """Call every listener; the first failure propagates after a best-effort undo."""
        called: list[StatusListener] = []
        for listener in list(self._listeners):
            try:
                listener(old, new)
            except Exception:
                self._log.failure(
                    "status listener refused the change from {old} to {new}",
                    old=old.display_name, new=new.display_name,
                )
                self._undo(called, old, new)
                raise
            called.append(listener)

    def _undo(self, listeners: list[StatusListener], old: Status, new: Status) -> None:
        """Tell C{listeners}, which accepted C{old -> new}, that it was undone."""
        for listener in reversed(listeners):
            try:
                listener(new, old)
            except Exception:
                self._log.failure(
                    "status listener failed while undoing the change from {old} to {new}",
                    old=old.display_name, new=new.display_name,
                )

    def _persist_or_revert(self, old: Status, new: Status) -> None:
        """Persist C{new}; if that fails, undo it for every listener and re-raise."""
        try:
            self._store(new)
        except Exception:
            self._log.failure("unable to write status file {path}", path=str(self._status_file))
            if new is not old:
                self._undo(list(self._listeners), old, new)
            raise

    def _grace_expired(self, new: Status) -> None:
        """Enforce the pending stricter status once its grace period is over."""
        self._pending = None
        self._enforced = new
        self._log.info("status grace period expired; {status} now enforced",
                       status=new.display_name)

    def _cancel_pending(self) -> None:
        """Cancel the grace-period timer, if any."""
        if self._pending is not None:
            if self._pending.active():
                self._pending.cancel()
            self._pending = None

    def _load(self) -> None:
        """Set the status from the status file's first line, if there is a usable one."""
        path = self._status_file
        if path is None:
            return
        try:
            with open(path, encoding="utf-8") as f:
                first_line = f.readline()
        except FileNotFoundError:
            self._log.info("no status stored at {path}; status is {status}",
                           path=str(path), status=self._default.display_name)
            return
        except (OSError, UnicodeDecodeError) as e:
            self._log.error("unable to read status file {path} ({error}); status is {status}",
                            path=str(path), error=str(e), status=self._default.display_name)
            return
        try:
            stored = parse_status(first_line)
        except UnknownStatus:
            self._log.error("unable to parse stored status {stored!r} in {path}; "
                            "status is {status}", stored=first_line, path=str(path),
                            status=self._default.display_name)
            return
        self._status = self._enforced = stored
        self._log.info("status {status} loaded from {path}",
                       status=stored.display_name, path=str(path))

    def _store(self, status: Status) -> None:
        """Write C{status} to the status file atomically (no-op without a file)."""
        path = self._status_file
        if path is None:
            return
        write_status_file(path, status)


def write_status_file(path: str | os.PathLike[str], status: Status) -> None:
    """
    Replace the file at C{path} with C{status.display_name + "\\n"} (UTF-8),
    atomically and durably.

    The content goes to a temporary file in the same directory, which is
    fsynced and renamed over C{path}; then the directory is fsynced. Missing
    parent directories are created. A reader sees the old or the new file,
    never a partial one.
    """
    target = Path(path)
    directory = target.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write((status.display_name + "\n").encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
