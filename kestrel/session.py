"""
ClientSession: what one connection may do, whatever its wire protocol.

It mirrors Kestrel's C{KestrelHandler} (plus its C{SimplePendingReads} and
C{ThriftPendingReads} traits): open reads per queue as a FIFO of xids, the
per-queue limit C{max_open_transactions}, the server status checks, blocking
reads that disconnects cancel, and thrift's open reads in the server's
L{kestrel.external_reads.ExternalReads}. Plain reads hold their items
(L{kestrel.held_reads.HeldReads}) until the protocol says their reply is in
the kernel.

Protocols translate bytes into calls here and results back into bytes; this
module knows nothing of sockets.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

from twisted.internet.defer import CancelledError, Deferred, DeferredList, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.errors import AvailabilityError, ControlRefused, KestrelError, TooManyOpenReads
from kestrel.held_reads import HeldReads
from kestrel.item import QItem
from kestrel.queue_info import QueueInfo
from kestrel.session_thrift import ThriftReads
from kestrel.settled import PENDING, Pending, in_deferred
from kestrel.status import Status
from kestrel.unsynced import Answer

if TYPE_CHECKING:
    from kestrel.collection import QueueCollection
    from kestrel.config import ServerConfig
    from kestrel.external_reads import ExternalReads
    from kestrel.metrics import Metrics
    from kestrel.stats import ServerStats
    from kestrel.status import ServerStatus

_T = TypeVar("_T")


class SessionHost(Protocol):
    """
    What a L{ClientSession} needs of the server it belongs to, handed to it
    at construction (L{kestrel.server.KestrelServer} is one). Sessions know
    the server only through this.

    @ivar config: read when needed, so that a config reload is seen.
    """

    collection: QueueCollection
    stats: ServerStats
    status: ServerStatus
    metrics: Metrics
    clock: IReactorTime
    config: ServerConfig
    max_open_transactions: int
    external_reads: ExternalReads

    def session_opened(self) -> tuple[int, bool, bool]:
        """A session starts: its id and whether it refuses writes and reads."""

    def session_closed(self) -> None:
        """A session ended."""

    def delete_queue(self, name: str) -> None:
        """Delete queue C{name} and its journal (and its fanout children)."""


def _result_now(d: Deferred[_T]) -> _T | Failure | Pending:
    """The outcome of a fired C{d} (a L{Failure} included), taken out of it, else L{PENDING}."""
    if not d.called or d.paused:
        return PENDING
    box: list[_T | Failure] = []
    d.addBoth(box.append)
    return box[0]


class ClientSession(ThriftReads):
    """
    One connection's view of the server (Kestrel's C{KestrelHandler}).

    Memcache and text open reads live in a per-queue FIFO of xids: C{close}
    and C{abort} act on the oldest, and L{finish} aborts them all. Thrift
    open reads (L{get_items}) live in the server's C{ExternalReads} and
    survive the connection.

    A plain read (memcache get, thrift get without auto-abort) holds its
    item in L{held_reads} until the protocol has the reply in the kernel;
    L{finish} returns it to its queue's head if the connection ends first.

    A session opened while the server already had more connections than
    C{connection_limit_refuse_writes} (or C{_reads}) refuses writes (or
    reads) for its whole life.

    Blocking reads that L{finish} cancels fail with L{CancelledError}.
    """

    _log = Logger()

    server: SessionHost  # (more than ThriftReads needs)

    def __init__(self, server: SessionHost, protocol_name: str = "memcache") -> None:
        self.server = server
        self.protocol_name = protocol_name
        self._collection = server.collection
        self._stats = server.stats
        self._status = server.status
        self._max_open = server.max_open_transactions
        self._clock = server.clock
        # (the clock's time function, called as a local: CPython 3.11 does not
        # specialize the reactor's seconds(), a builtin in its class, per call)
        self._seconds = server.clock.seconds
        self._metrics = server.metrics
        self.session_id, self.refuse_writes, self.refuse_reads = server.session_opened()
        self._open_reads: dict[str, deque[int]] = {}
        self._external_counts: dict[str, int] = {}
        self._waiters: set[Deferred] = set()
        #: Plain reads whose reply may not be in the kernel yet (see L{HeldReads}).
        self.held_reads = HeldReads(self._collection)
        self._coalescer = server.collection.write_coalescer
        self.finished = False
        #: The client sends nothing more (FIN seen): no read of this session waits.
        self.input_closed = False

    # -- checks ------------------------------------------------------------

    def _check_reads(self, op: str) -> None:
        if self.refuse_reads or self._status.blocks_reads:
            self._log.debug("Blocking {op} (session {sid})", op=op, sid=self.session_id)
            raise AvailabilityError(op)

    def _check_writes(self, op: str) -> None:
        if self.refuse_writes or self._status.blocks_writes:
            self._log.debug("Blocking {op} (session {sid})", op=op, sid=self.session_id)
            raise AvailabilityError(op)

    # -- open reads --------------------------------------------------------

    def count_open_reads(self, name: str) -> int:
        """Open reads this session holds on queue C{name} (thrift ones included)."""
        fifo = self._open_reads.get(name)
        return (len(fifo) if fifo else 0) + self._external_counts.get(name, 0)

    def _add_open_read(self, name: str, xid: int) -> None:
        fifo = self._open_reads.get(name)
        if fifo is None:  # (not setdefault: its deque would be made per read)
            fifo = self._open_reads[name] = deque()
        fifo.append(xid)
        if self.finished:
            self._stats.finished_but_add += 1
            self._abort_all_open_reads()

    def abort_read(self, name: str) -> bool:
        """Return the oldest open read on C{name} to the head of its queue; whether one existed."""
        fifo = self._open_reads.get(name)
        if not fifo:
            self._log.debug("No open read to abort on {queue} (session {sid})",
                            queue=name, sid=self.session_id)
            return False
        self._collection.unremove(name, fifo.popleft())
        return True

    def close_read(self, name: str) -> bool | Deferred[bool]:
        """
        Confirm the oldest open read on C{name}; whether one existed. On a
        queue that acknowledges durably, a Deferred instead (see L{close_reads}).
        """
        # (close_reads of one read, without its loop: a client's /close runs it per item)
        fifo = self._open_reads.get(name)
        if not fifo:
            return False
        xid = fifo.popleft()
        done = self._collection.confirm_read(name, xid)
        return True if done is None else self._confirms([(xid, done)], name)

    def close_reads(self, name: str, count: int) -> bool | Deferred[bool]:
        """
        Confirm the C{count} oldest open reads on C{name}, all or nothing.

        Returns false (confirming nothing) if fewer than C{count} are open or
        C{count} is not positive. On a queue that acknowledges durably
        (L{kestrel.queue.PersistentQueue.confirm_durably}), a Deferred firing
        C{True} once every confirm is durable; if one is refused or its record
        lost, it fails (L{kestrel.errors.JournalUnavailable}) and those reads
        are this session's again, at the front of its reads in their order
        (aborted if the session has finished).
        """
        fifo = self._open_reads.get(name)
        if count <= 0 or not fifo or len(fifo) < count:
            return False
        confirm = self._collection.confirm_read
        waits = []
        for _ in range(count):
            xid = fifo.popleft()
            done = confirm(name, xid)
            if done is not None:
                waits.append((xid, done))
        return True if not waits else self._confirms(waits, name)

    def _confirms(self, waits: list[tuple[int, Deferred[None]]], name: str) -> Deferred[bool]:
        """Durable confirms of C{name}'s reads: C{True} once all are durable (L{close_reads})."""
        def settled_all(results: Any) -> bool:
            lost = [xid for (xid, _), (ok, _) in zip(waits, results, strict=True) if not ok]
            if not lost:
                return True
            if self.finished:  # (nobody to confirm them: back to the queue, the first first)
                for xid in reversed(lost):
                    self._collection.unremove(name, xid)
            else:
                self._open_reads.setdefault(name, deque()).extendleft(reversed(lost))
            failure = next(result for ok, result in results if not ok)
            assert isinstance(failure, Failure)
            failure.raiseException()
        return DeferredList([d for _, d in waits], consumeErrors=True).addCallback(settled_all)

    def close_all_reads(self, name: str, after_replies: bool = False) -> int:
        """
        Confirm every open read on C{name}; return how many. With
        C{after_replies} they join L{held_reads} (the protocol settles them).
        """
        fifo = self._open_reads.pop(name, None)
        if not fifo:
            return 0
        settle = self.held_reads.hold if after_replies else self._collection.confirm_remove
        for xid in fifo:
            settle(name, xid)
        return len(fifo)

    def _abort_all_open_reads(self) -> int:
        """
        Abort every memcache/text open read and return every held plain
        read (L{held_reads}) to its queue; return how many open reads.

        Per queue the newest goes back first, so that the one handed out
        first ends at the head and is delivered first (docs/differences.md).
        """
        reads, self._open_reads = self._open_reads, {}
        back = self.held_reads.take_all()
        count = sum(len(fifo) for fifo in reads.values())
        self._stats.cmd_get_open_dropped += count
        if back:  # (plain and open reads on one queue: their xids give the order)
            back.extend((name, xid) for name, fifo in reads.items() for xid in fifo)
            reads = {}
            for name, xid in sorted(back, key=lambda read: read[1]):
                reads.setdefault(name, deque()).append(xid)
        for name, fifo in reads.items():
            while fifo:
                self._collection.unremove(name, fifo.pop())
        return count

    # -- waiters -----------------------------------------------------------

    def _add_waiter(self, d: Deferred) -> None:
        self._waiters.add(d)
        if self.finished:
            self._abort_waiters()

    def _abort_waiters(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for d in waiters:
            self._stats.cmd_get_timeout_dropped += 1
            self._stats.waiters_aborted += 1
            d.cancel()

    def end_waits(self) -> int:
        """
        The client's side of the connection closed (FIN): end every blocking
        read now; return how many were waiting.

        No item is handed to them: each pending C{get_item} fires with
        C{None}, each monitor stream (thrift C{get} included) ends with what
        it has (a thrift C{get} without auto-abort puts back what it
        collected and fires with nothing), and reads asked for later do not
        wait. Requests that were complete are still answered
        (docs/reliability.md: a half-closed client gets the replies it is owed).
        """
        self.input_closed = True
        count = len(self._waiters)
        if count:
            self._log.debug("Client of session {sid} closed its side: ending {n} waits",
                            sid=self.session_id, n=count)
            self._abort_waiters()
        return count

    # -- reads -------------------------------------------------------------

    def get_item(self, name: str, deadline: float | None, open_read: bool,
                 peeking: bool) -> Deferred[QItem | None]:
        """L{read_item}, its outcome always in a Deferred."""
        return in_deferred(self.read_item(name, deadline, open_read, peeking))

    def read_item(self, name: str, deadline: float | None, open_read: bool, peeking: bool,
                  reply_now: bool = False) -> QItem | None | Deferred[QItem | None]:
        """
        Fetch (C{peeking}: look at) the head of C{name}, waiting until C{deadline}:
        the item (or C{None}) if answered at once, else a Deferred of it. With
        C{open_read} it becomes an open read of this session; a plain read holds
        it in L{held_reads} until the protocol has its reply in the kernel
        (C{reply_now}: written at the end of this pass, before another connection
        runs: L{HeldReads.peek_for_reply}). Raises L{AvailabilityError} when reads
        are blocked, L{TooManyOpenReads} when this session holds
        C{max_open_transactions} open reads on the queue. Counts C{cmd_get} or
        C{cmd_peek}.

        Metrics: a read answered at once records C{get_hit_latency_usec} or
        C{get_miss_latency_usec}; an item removed (not peeked) C{delivery_latency_msec};
        a wait that reached its deadline C{get_timeout_msec}.
        """
        if self.refuse_reads or self._status.blocks_reads:  # (_check_reads' test, inlined)
            self._check_reads("getItem")
        if open_read and self.count_open_reads(name) >= self._max_open:
            self._log.warn("Too many open reads on {queue} (session {sid})",
                           queue=name, sid=self.session_id)
            raise TooManyOpenReads(name)
        if peeking:
            self._stats.cmd_peek += 1
        else:
            self._stats.cmd_get += 1
        if self.input_closed or self.finished:
            deadline = None
        seconds = self._seconds
        started = seconds()
        holding = not (open_read or peeking)
        if reply_now:  # (a plain read is held in place; any other first takes those held)
            item = self.held_reads.peek_for_reply(name, holding)
            if item is not None:  # (a hit, recorded as _record_read does)
                now = seconds()
                self._metrics.record_hit(name, (now - started) * 1e6, now * 1000 - item.add_time_ms)
                return item
        d = self._collection.take(name, deadline, not peeking, peeking, holding)
        # (answered at once: the hot path; not isinstance(d, Deferred), an ABC's
        # check, which costs a Python call)
        if d is None:  # (recorded as _record_read does, here and below)
            self._metrics.record_miss(name, (seconds() - started) * 1e6)
            return None
        if type(d) is QItem:
            now = seconds()
            if peeking:
                self._metrics.record_hit(name, (now - started) * 1e6, None)
            else:  # (held for the reply, or an open read)
                self._metrics.record_hit(name, (now - started) * 1e6, now * 1000 - d.add_time_ms)
                if holding:  # (called as methods: no bound method made per read)
                    self.held_reads.hold(name, d.xid)
                else:
                    self._add_open_read(name, d.xid)
            return d
        if not d.called:
            self._add_waiter(d)
            d.addBoth(self._forget_waiter, d)
            d.addErrback(self._wait_ended_by_close)
            d.addCallback(self._record_waited_read, name, started, deadline, peeking)
        if holding:
            return d.addCallback(self._got_held_item, name)
        if open_read:
            d.addCallback(self._got_open_item, name)
        return d

    def _record_read(self, name: str, started: float, result: object, peeking: bool) -> None:
        """Record the latencies of a read answered at once with C{result}."""
        seconds = self._seconds
        now = seconds()
        if result is None:
            self._metrics.record_miss(name, (now - started) * 1e6)
        elif result.__class__ is QItem:
            self._metrics.record_hit(name, (now - started) * 1e6,
                                     None if peeking else now * 1000 - result.add_time_ms)

    def _record_waited_read(self, item: QItem | None, name: str, started: float,
                            deadline: float | None, peeking: bool) -> QItem | None:
        """Record the latencies of a read that waited: its delivery, or its timeout."""
        now = self._clock.seconds()
        if item is not None:
            if not peeking:
                self._metrics.record_delivery(name, now * 1000 - item.add_time_ms)
        elif deadline is not None and now >= deadline:
            self._metrics.record_get_timeout(name, (now - started) * 1000)
        return item

    def _got_held_item(self, item: QItem | None, name: str) -> QItem | None:
        if item is not None:
            if self.finished:
                self._collection.unremove(name, item.xid)
                return None
            self.held_reads.hold(name, item.xid)
        return item

    def _got_open_item(self, item: QItem | None, name: str) -> QItem | None:
        if item is not None:
            self._add_open_read(name, item.xid)
        return item

    def _forget_waiter(self, result: object, d: Deferred) -> object:
        self._waiters.discard(d)
        return result

    def _wait_ended_by_close(self, failure: Failure) -> None:
        """A wait cancelled because the client closed its side ends with no item."""
        failure.trap(CancelledError)
        if self.finished or not self.input_closed:
            failure.raiseException()
        return None

    def monitor_until(self, name: str, deadline: float | None, max_items: int, open_read: bool,
                      got_item: Callable[[QItem], None]) -> Deferred[None]:
        """
        Hand items of C{name} to C{got_item} until C{max_items} were given, the
        deadline passes, the queue stays empty, or this session holds
        C{max_open_transactions} open reads on it; then fire.

        With C{open_read} every item is an open read. Raises L{AvailabilityError}
        if reads are blocked now; if they become blocked mid-stream the stream
        just ends. Cancelled by L{finish}, it fires with C{None} too; it fails
        if the queue fails or C{got_item} raises (the item stays an open read).
        """
        self._check_reads("monitorUntil")
        self._stats.cmd_monitor += 1
        record = self._add_open_read if open_read else None
        return self._monitor(name, deadline, max_items, open_read,
                             lambda item, _external: got_item(item), record)

    def _monitor(self, name: str, deadline: float | None, max_items: int, open_read: bool,
                 got_item: Callable[[QItem, int], None],
                 record: Callable[[str, int], int | None] | None) -> Deferred[None]:
        done: Deferred[None] = Deferred()
        clock = self.server.clock
        held = open_read and record is None  # (a thrift get holding items for its reply)

        def step(remaining: int) -> None:
            while True:
                if (self._status.blocks_reads or remaining == 0
                        or (deadline is not None and deadline <= clock.seconds())
                        or self.count_open_reads(name) >= self._max_open):
                    done.callback(None)
                    return
                self._stats.cmd_monitor_get += 1
                self._stats.cmd_get += 1  # every fetch is a get, as get_hits/get_misses count
                started = clock.seconds()
                wait_until = None if self.input_closed or self.finished else deadline
                try:
                    d = self._collection.remove(name, wait_until, open_read, False, held)
                except KestrelError:
                    # (the queue's journal failed): the stream ends with the error.
                    done.errback(Failure())
                    return
                result = _result_now(d)
                if result is PENDING:
                    self._add_waiter(d)
                    d.addCallback(self._record_waited_read, name, started, deadline, False)
                    d.addBoth(resume, d, remaining)
                    return
                self._record_read(name, started, result, False)
                if not handle(result):
                    return
                remaining -= 1

        def handle(result: QItem | Failure | None) -> bool:
            if isinstance(result, Failure):
                if result.check(CancelledError):
                    done.callback(None)
                elif result.check(KestrelError):  # (a refusal the client is told: no traceback)
                    done.errback(result)
                else:
                    self._log.failure("Monitor on {queue} failed", result, queue=name)
                    done.errback(result)
                return False
            if result is None:
                done.callback(None)
                return False
            external = record(name, result.xid) if record is not None else None
            try:
                got_item(result, external or 0)
            except Exception:
                failure = Failure()
                self._log.failure("Monitor consumer on {queue} failed", failure, queue=name)
                done.errback(failure)
                return False
            return True

        def resume(result: QItem | Failure | None, d: Deferred, remaining: int) -> None:
            self._waiters.discard(d)
            if handle(result):
                step(remaining - 1)

        step(max_items)
        return done

    def queue_info(self, name: str) -> QueueInfo | None:
        """
        The counters of queue C{name} now (L{QueueCollection.queue_info}), or
        C{None} when no such queue exists; nothing is created and nothing counted.
        """
        return self._collection.queue_info(name)

    # -- writes ------------------------------------------------------------

    def set_item(self, name: str, data: bytes, expiry_ms: int = 0) -> Deferred[bool]:
        """L{offer_item}, its outcome always in a Deferred."""
        return in_deferred(self.offer_item(name, data, expiry_ms))

    @overload
    def offer_item(self, name: str, data: bytes, expiry_ms: int = ...,
                   answer: None = ...) -> bool | Deferred[bool]: ...

    @overload
    def offer_item(self, name: str, data: bytes, expiry_ms: int,
                   answer: Answer) -> bool | Deferred[bool] | None: ...

    def offer_item(self, name: str, data: bytes, expiry_ms: int = 0,
                   answer: Answer | None = None) -> bool | Deferred[bool] | None:
        """
        Add C{data} to C{name} (absolute expiry in epoch ms, 0: never): whether
        it was stored, when the add answered at once without a Deferred (as
        L{QueueCollection.offer}), else a Deferred of it. Raises
        L{AvailabilityError} when writes are blocked.

        Records C{set_latency_usec}: until the add answered, which for a
        durable acknowledgement is after the fsync that covers it. Given
        C{answer}, an add answered later calls C{answer(outcome)} then
        (outcome: C{True}, C{False} or the L{Failure}): in the callback of
        the returned Deferred, whose result is C{answer}'s, or, for a durable
        add to a plain queue, with no Deferred at all (C{None} is returned:
        L{PersistentQueue.offer}'s C{then}; the queue records its latency).
        """
        if self.refuse_writes or self._status.blocks_writes:
            raise AvailabilityError("setItem")
        self._stats.cmd_set += 1
        seconds = self._seconds
        started = seconds()
        stored = self._collection.offer(name, data, expiry_ms, answer)
        if stored is None:
            return None  # (the queue records its latency, then answers)
        if stored is True or stored is False or stored.called:
            # Answered at once (the hot path): record directly, no callback.
            self._metrics.record_set(name, (seconds() - started) * 1e6)
            return stored
        return stored.addBoth(self._set_answered, name, started, answer)

    def _set_answered(self, outcome: object, name: str, started: float,
                      answer: Answer | None) -> object:
        """Record C{set_latency_usec} of an add that answered later; C{answer} it, if given."""
        self._metrics.record_set(name, (self._clock.seconds() - started) * 1e6)
        return outcome if answer is None else answer(outcome)  # type: ignore[arg-type]

    def set_items(self, name: str, items: Iterable[bytes], expiry_ms: int = 0, *,
                  stop_at_refusal: bool = False) -> Deferred[list[object]]:
        """
        Offer C{items} to C{name} in order (a text or thrift C{put}); fire with
        the outcome of each item offered: C{True} (stored), C{False} (refused)
        or the L{Failure} of its add, once every durable acknowledgement is in.

        With C{stop_at_refusal} (thrift), the items after the first refusal
        are not offered; without it (text), every item is. A L{KestrelError}
        raised for the first item (writes blocked, bad queue name) propagates;
        raised for a later one, it ends the batch there.
        """
        outcomes: list[list[object]] = []
        waits: list[Deferred[None]] = []
        for data in items:
            try:
                d = self.set_item(name, data, expiry_ms)
            except KestrelError:
                if not outcomes:
                    raise
                break
            box: list[object] = []
            boxed = d.addBoth(box.append)
            outcomes.append(box)
            if not box:
                waits.append(boxed)
            elif stop_at_refusal and box[0] is not True:
                break

        def collect(_: object = None) -> list[object]:
            return [box[0] for box in outcomes]

        if not waits:
            return succeed(collect())
        return DeferredList(waits).addCallback(collect)

    def flush(self, name: str) -> None:
        """Empty queue C{name} (writes must be allowed)."""
        self._check_writes("flush")
        self._collection.flush(name)

    def delete(self, name: str) -> None:
        """Delete queue C{name} and its journal (writes must be allowed)."""
        self._check_writes("delete")
        self.server.delete_queue(name)

    def flush_expired(self, name: str) -> int:
        """Discard expired items of C{name}; return how many (writes must be allowed)."""
        self._check_writes("flushExpired")
        return self._collection.flush_expired(name)

    def check_control(self, command: str) -> None:
        """
        Refuse control command C{command} (shutdown, reload, flush_all, a
        status change) with L{ControlRefused} when the config keeps control
        commands to the admin port (C{control_commands: admin_only}).
        """
        if self.server.config.control_admin_only:
            raise ControlRefused(command)

    def flush_all(self) -> None:
        """Empty every queue (writes must be allowed; a control command, see L{check_control})."""
        self.check_control("flush_all")
        self._check_writes("flushAll")
        self._collection.flush_all()

    def flush_all_expired(self) -> int:
        """
        Discard expired items of every queue; return how many.

        Unlike Kestrel, writes must be allowed (docs/differences.md).
        """
        self._check_writes("flushAllExpired")
        return self._collection.flush_all_expired()

    # -- write batches -----------------------------------------------------

    def hold_writes(self) -> None:
        """
        Open a write batch: journal writes are held back until L{release_writes}
        (or L{flush_writes}) and then reach each file in one write.

        Only the protocol base opens batches, for the rest of one pass over a
        connection's input once more input follows a request
        (L{kestrel.protocols.base.SessionProtocol.begin_write_batch}).
        The caller must call L{flush_writes} before it sends any reply that
        depends on those writes, and L{release_writes} when the batch ends.
        """
        self._coalescer.begin()

    def release_writes(self) -> None:
        """Close a write batch; the outermost one hands the held writes to the OS."""
        self._coalescer.end()

    def flush_writes(self) -> bool:
        """
        Hand every held-back journal write to the OS now; return whether every
        held-back write of the open batch got there (true outside a batch).

        A false result means some write acknowledged in memory in this batch
        may not be in its journal: replies that depend on it must not be sent.
        """
        return self._coalescer.flush_batch()

    # -- status ------------------------------------------------------------

    def current_status(self) -> Status:
        """The reported server status; its C{str} is Kestrel's name (C{Up}, C{ReadOnly}, ...)."""
        return self._status.status

    def set_status(self, name: str) -> None:
        """
        Ask for status C{name}; raises L{kestrel.errors.UnknownStatus} or
        L{kestrel.errors.ForbiddenStatus} as the status object decides, and
        L{ControlRefused} when control commands are kept to the admin port.
        """
        self.check_control("status")
        self._status.set_status(name)

    # -- end ---------------------------------------------------------------

    def finish(self) -> None:
        """
        End the session (the connection is gone); safe to call twice.

        Every memcache/text open read is aborted (C{cmd_get_open_dropped});
        every pending wait is cancelled (C{waiters_aborted},
        C{cmd_get_timeout_dropped}); thrift open reads stay open.
        """
        if self.finished:
            return
        self.finished = True
        # Waits first: an aborted read would otherwise wake this session's own waiter.
        self._abort_waiters()
        aborted = self._abort_all_open_reads()
        self._external_counts.clear()
        self.server.session_closed()
        self._log.debug("End of {protocol} session {sid} ({aborted} open reads aborted)",
                        protocol=self.protocol_name, sid=self.session_id, aborted=aborted)
