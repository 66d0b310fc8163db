"""
What a queue does when its journal cannot be written: one state machine.

::

    ok --write or fsync fails--> failed --journal cut back, memory reloaded--> read-only
    read-only --probe written and synced--> ok      (tried every JOURNAL_RETRY_SECONDS)
    read-only --a read's record fails--> failed      (so does a failed probe's write)

L{JournalHealth} drives the recovery itself: the journal reports a failure
to it (C{on_failure}); it asks the journal to cut back (C{recover}), asks
its host (the queue) to rebuild memory from what the journal holds
(L{HealthHost.reload}), and probes the journal until a write works. The
journal calls nothing but L{JournalHealth.failed}; the queue calls nothing
of the recovery. Time is the injected clock.

L{Unsettled} keeps what the queue told its clients that the journal may not
hold yet (removes, opens, confirms and aborts whose records are not known
durable), in order, so that a reload applies them again: nothing
acknowledged is undone by a fault, and no open read is left without its
holder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from twisted.internet.defer import CancelledError, Deferred, fail
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.errors import JournalUnavailable
from kestrel.journal.interface import IJournal
from kestrel.settled import PENDING, settled

#: Seconds between attempts to recover or probe a failed journal (see docs/journal.md).
JOURNAL_RETRY_SECONDS = 1.0

OK = "ok"
FAILED = "failed"
READ_ONLY = "read-only"
PROBING = "probing"

#: What an L{Unsettled} entry records.
OPEN = 0
CONFIRM = 1
ABORT = 2
REMOVE = 3


def reason_of(error: BaseException | None) -> str:
    """A short reason for an I/O error: C{No space left on device (errno 28)}."""
    if isinstance(error, OSError) and error.strerror:
        return f"{error.strerror} (errno {error.errno})"
    return str(error) or type(error).__name__


def unavailable_failure(queue: str, failure: Failure) -> Failure:
    """
    A failed journal write or fsync as its producer hears it: C{failure}
    itself if it is a L{JournalUnavailable}, else one naming C{queue} and
    the cause (L{reason_of}).
    """
    if failure.check(JournalUnavailable):
        return failure
    return Failure(JournalUnavailable(queue, reason_of(failure.value)))


class HealthHost(Protocol):
    """What L{JournalHealth} asks of the queue whose journal it watches."""

    @property
    def xid_counter(self) -> int:
        """The last xid handed out (the probe saves it)."""
        ...

    def reload(self) -> None:
        """Rebuild memory from the journal (just cut back) and journal what it owes."""
        ...

    def readable_again(self) -> None:
        """Memory agrees with the journal again: serve the readers that wait."""
        ...


class JournalHealth:
    """
    The failure state of one queue's journal: C{ok}, C{failed}, C{read-only}
    or C{probing}.

    Promises: adds are taken only in C{ok}; reads only outside C{failed}
    (memory is being rebuilt then); after a failure memory is rebuilt from
    the journal once the journal is cut back, retried every
    C{retry_seconds} until it works; C{ok} comes back only after a probe
    record was written and synced. Nothing runs after L{close}.
    """

    _log = Logger()

    def __init__(self, name: str, journal: IJournal, clock: IReactorTime, host: HealthHost,
                 *, fsync_failed: Callable[[OSError], None] | None = None,
                 retry_seconds: float = JOURNAL_RETRY_SECONDS) -> None:
        self._name = name
        self._journal = journal
        self._clock = clock
        self._host = host
        self._fsync_failed = fsync_failed
        self._retry = retry_seconds
        self.state = OK
        #: Why the journal cannot be written (empty in C{ok}).
        self.reason = ""
        #: How many failures were reported (a failure inside C{failed} counts too).
        self.failures = 0
        #: How many of them were refused writes (not fsyncs): bytes that never
        #: reached the OS.
        self.write_failures = 0
        self._kind = "write"
        self._call: IDelayedCall | None = None
        self._recovering = False
        self._closed = False
        journal.on_failure = self.failed

    @property
    def state(self) -> str:
        """C{ok}, C{failed}, C{read-only} or C{probing}."""
        return self._state

    @state.setter
    def state(self, state: str) -> None:
        # (the two tests below are read per request: plain attributes, set here)
        self._state = state
        #: Whether adds are taken (C{ok}).
        self.takes_adds = state is OK
        #: Whether reads are served: memory agrees with the journal (not C{failed}).
        self.readable = state is not FAILED

    def unavailable(self) -> JournalUnavailable:
        """The error a refused request gets, naming the queue and the reason."""
        return JournalUnavailable(self._name, self.reason)

    def failed(self, kind: str, error: OSError) -> None:
        """
        A write (C{kind} C{"write"}) or fsync (C{"fsync"}) of the journal
        failed: go to C{failed} and recover on the next reactor turn.
        """
        self.failures += 1
        if kind != "fsync":
            self.write_failures += 1
        elif self._fsync_failed is not None:
            self._fsync_failed(error)
        if self._closed:
            return
        self.reason = reason_of(error)
        if kind == "fsync":
            self._kind = "fsync"
        if self.state is FAILED:
            return
        if self._recovering:
            # (a write of the reload itself: the recovery goes on, then retries)
            self.state = FAILED
            return
        self._kind = kind
        self.state = FAILED
        self._log.error(
            "Journal {kind} failed for {queue}: {error}; the queue is read-only until its "
            "journal can be written again", kind=kind, queue=self._name, error=self.reason)
        self._schedule(0.0, self._recover)

    def close(self) -> None:
        """The queue closed: stop every timer; nothing more happens."""
        self._closed = True
        self._cancel()

    # -- the machine

    def _cancel(self) -> None:
        call, self._call = self._call, None
        if call is not None and call.active():
            call.cancel()

    def _schedule(self, delay: float, step: Callable[[], None]) -> None:
        self._cancel()
        self._call = self._clock.callLater(delay, step)

    def _recover(self) -> None:
        """C{failed}: cut the journal back to what it surely holds."""
        self._call = None
        if self._closed:
            return
        self._recovering = True
        # (the cut-back settles an fsync's doubt; an fsync failing from now
        # on, while it runs included, makes the next recovery's kind again)
        kind, self._kind = self._kind, "write"
        try:
            d = self._journal.recover(kind, OSError(self.reason))
        except Exception as e:
            d = fail(e)
        d.addCallbacks(self._recovered, self._recovery_failed,
                       callbackArgs=(self.failures,), errbackArgs=(kind,))

    def _recovered(self, _kept: int, failures: int) -> None:
        """
        The journal is cut back: rebuild memory from it, then go read-only;
        unless a write or fsync failed while it was cut back (C{failures}: the
        count when it began): then cut back again, later.
        """
        if self._closed:
            self._recovering = False
            return
        if self.failures != failures:
            self._recovering = False
            self._schedule(self._retry, self._recover)
            return
        self.state = READ_ONLY
        try:
            self._host.reload()
        except Exception:
            self._recovery_failed(Failure())
            return
        self._recovering = False
        if self.state is FAILED:
            # A record the reload wrote failed too: try again later.
            self._schedule(self._retry, self._recover)
            return
        self._log.warn("Journal of {queue} reloaded after a failure; adds are refused until "
                       "the journal can be written", queue=self._name)
        # The probe is due before the readers are woken: the record of one
        # they serve may fail too, and that failure's recovery (scheduled by
        # failed) must replace the probe, not be replaced by it.
        self._schedule(self._retry, self._probe)
        self._host.readable_again()

    def _recovery_failed(self, failure: Failure, kind: str = "write") -> None:
        """The cut-back (C{kind}'s) or the reload failed: try again later."""
        self._recovering = False
        if kind == "fsync":  # (not cut back: that doubt is still to settle)
            self._kind = kind
        self.state = FAILED
        self.reason = reason_of(failure.value)
        if self._closed:
            return
        self._log.error("Journal of {queue} still cannot be written ({error}); retrying in "
                        "{delay}s", queue=self._name, error=self.reason, delay=self._retry)
        self._schedule(self._retry, self._recover)

    def _probe(self) -> None:
        """C{read-only}: write and sync a harmless record."""
        self._call = None
        if self._closed or self.state is not READ_ONLY:
            return
        self.state = PROBING
        try:
            d = self._journal.probe(self._host.xid_counter)
        except Exception as e:
            d = fail(e)
        d.addCallbacks(self._probed, self._probe_failed)

    def _probed(self, _: object) -> None:
        if self._closed or self.state is not PROBING:
            return
        self.state = OK
        self.reason = ""
        self._log.info("Journal of {queue} can be written again; the queue takes adds",
                       queue=self._name)

    def _probe_failed(self, failure: Failure) -> None:
        if self._closed or self.state is not PROBING:
            return  # (a failure the journal reported already moved the machine)
        self.state = READ_ONLY
        self.reason = reason_of(failure.value)
        self._schedule(self._retry, self._probe)


class Unsettled:
    """
    Writes the records whose durability nobody waits for, logs their
    failures, and keeps the removes, opens, confirms and aborts among them
    that the journal may not hold yet, in the order they happened.

    An entry is settled (forgotten) once its record is durable and known to
    have reached the OS: no write was refused between it and the flush that
    put it there. L{take} hands the rest to a reload, oldest first: a close is
    applied again if the journal still holds the read open; a remove or an
    open whose record reached the OS (so its item was handed out) is made
    again if the item is back at the head. Bounded by the records in flight (one sync
    period's worth) plus the closes asked while the journal failed.
    """

    __slots__ = ("_name", "_entries", "_seq", "_health", "_journal", "_held")

    _log = Logger()

    def __init__(self, name: str, health: JournalHealth, journal: IJournal) -> None:
        self._name = name
        # seq -> [what, xid, item key, written, durable]
        self._entries: dict[int, list] = {}
        self._seq = 0
        self._health = health
        self._journal = journal
        # The entries held back in the open write batch since its last flush
        # (their seqs), and the write failures counted when the first was:
        # one after_written call settles them all.
        self._held: tuple[list[int], int] | None = None

    def __len__(self) -> int:
        """How many entries are unsettled."""
        return len(self._entries)

    def write(self, write: Callable[..., Deferred[None] | None], *args: object,
              note: tuple[int, int, object] | None = None, handed: bool = False) -> bool:
        """
        Write a record (C{write(*args)}, a journal method); log any failure.

        With C{note} (what, xid, item key), it is kept until settled (see
        L{note}). Returns false if the write was refused at once.
        """
        try:
            d = write(*args)
        except Exception as e:
            d = self.refused(e)
        return self.written(d, note, handed)

    def refused(self, error: Exception) -> Deferred[None]:
        """A journal write raised C{error}: logged; its failed Deferred (see L{written})."""
        self._log.failure("Journal write failed for {queue}", queue=self._name)
        return fail(error)

    def written(self, d: Deferred[None] | None, note: tuple[int, int, object] | None = None,
                handed: bool = False) -> bool:
        """
        What L{write} does with the answer C{d} of a journal method it
        called: a caller that calls the journal itself hands its answer
        here (or, for a refusal, L{refused}'s). A plain remove or an open
        read (C{note}, not C{handed}) answered C{None} needs no call.
        """
        # (settled(d), inlined: a journal write's own Deferred is never paused;
        # no Deferred: nothing to wait for)
        outcome = None if d is None else d.result if d.called else PENDING
        if outcome is None:  # (in the OS, durable: the usual case)
            # Durable once written (no sync period), it need be kept only in
            # a batch, until the flush; and a remove or an open not known to
            # be handed out then would be ignored by a reload (it is not
            # taken again): only closes, and handed removes and opens, are kept.
            if note is not None and (handed or note[0] == CONFIRM or note[0] == ABORT) and (
                    not self._journal.writes_now()):
                what, xid, key = note
                self._keep(what, xid, key, None, False, True, False, handed)
            return True
        assert d is not None
        if note is not None:
            self.note(*note, d, handed=handed)
        refused = isinstance(outcome, Failure)
        if outcome is PENDING or refused:
            d.addErrback(self.write_failed)
        return not refused

    def write_failed(self, failure: Failure) -> None:
        """Log the failure of a record's write or fsync (an I/O error without traceback)."""
        if failure.check(CancelledError) is not None:
            return
        if failure.check(OSError, JournalUnavailable) is not None:
            # An I/O error, not a bug: the journal also reported it through
            # on_failure, and the queue recovers from it.
            self._log.error("Journal write failed for {queue}: {error}", queue=self._name,
                            error=failure.value)
            return
        self._log.failure("Journal write failed for {queue}", failure=failure,
                          queue=self._name)

    def note(self, what: int, xid: int, key: object, d: Deferred[None] | None, *,
             handed: bool = False) -> None:
        """
        Keep C{what} (L{REMOVE}, L{OPEN}, L{CONFIRM} or L{ABORT}) of C{xid} until its record
        settles: C{d} is what the record's write returned (C{None}: nothing to
        wait for). C{key} tells an open's item (compared with the head's at
        reload); C{handed}: the open's item is known to be a reader's already
        (else it is once the record is in the OS).
        """
        # (no batch open: a record written is in the OS when its write returns;
        # durable already: no callback needed to know it)
        in_os = self._journal.writes_now()
        durable, refused = True, False
        if d is not None:
            outcome = settled(d)
            durable = outcome is None
            refused = isinstance(outcome, Failure)
        if durable and in_os:
            return  # (settled at once: what _all_written and _durable would find)
        self._keep(what, xid, key, d, in_os, durable, refused, handed)

    def keep(self, what: int, xid: int, key: object) -> None:
        """Keep C{what} of C{xid} (as L{note}), for which no record was written, for the reload."""
        self._keep(what, xid, key, None, False, False, True, False)

    def _keep(self, what: int, xid: int, key: object, d: Deferred[None] | None, in_os: bool,
              durable: bool, unwritten: bool, handed: bool) -> None:
        """
        L{note}'s entry, for a record not known both in the OS and durable
        (C{unwritten}: refused, or none written).
        """
        self._seq = seq = self._seq + 1
        entry = [what, xid, key, handed, durable]
        self._entries[seq] = entry
        if unwritten:
            return
        if in_os:
            entry[3] = True  # (what _all_written would find now)
        else:
            held = self._held
            failures = self._health.write_failures
            if held is None or held[1] != failures:
                self._held = held = ([], failures)
                self._journal.after_written(self._all_written, held)
            held[0].append(seq)
        if not durable:
            assert d is not None
            d.addCallback(self._durable, seq)

    def _all_written(self, held: tuple[list[int], int]) -> None:
        # (no write refused since these records': they reached the OS; an
        # fsync that failed since does not take that back)
        if self._held is held:
            self._held = None
        seqs, write_failures = held
        if self._health.write_failures != write_failures:
            return
        entries = self._entries
        for seq in seqs:
            entry = entries.get(seq)
            if entry is not None:
                entry[3] = True
                if entry[4]:
                    del entries[seq]

    def _durable(self, result: None, seq: int) -> None:
        entry = self._entries.get(seq)
        if entry is not None:
            entry[4] = True
            if entry[3]:
                del self._entries[seq]
        return result

    def restore(self, entries: list[tuple[int, int, object, bool]]) -> None:
        """Put back what L{take} handed out (a reload that failed), before anything newer."""
        newer = self._entries
        self._entries = {}
        for what, xid, key, handed in entries:
            self._seq += 1
            self._entries[self._seq] = [what, xid, key, handed, False]
        for seq, entry in newer.items():
            self._entries[seq] = entry

    def take(self) -> list[tuple[int, int, object, bool]]:
        """Every unsettled entry, oldest first, as C{(what, xid, key, handed)}; forget them."""
        entries, self._entries = self._entries, {}
        return [(what, xid, key, handed) for what, xid, key, handed, _ in entries.values()]
