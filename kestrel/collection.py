"""
QueueCollection: every queue of one server, its fanouts and aliases.

It mirrors Kestrel's C{QueueCollection}: queues are found in the queue
directory at start and replayed, created on first reference, registered as
fanout children of their master, and swept for expired items on a timer.
It is a Twisted L{Service}; it knows nothing of sockets or protocols. Time
comes from the injected C{clock}.

The behaviour is Kestrel 2.4's fanout, aliases, names, delete and flush,
with the fixes listed in C{docs/differences.md}; the choices made where
Kestrel gives no answer are stated in the docstrings below.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import TypeVar, overload

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList, fail, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.aliases import AliasedQueue, all_true, apply_aliases
from kestrel.collection_expiry import ExpirySweeps
from kestrel.config import ServerConfig
from kestrel.errors import QueueLoading, ShuttingDown
from kestrel.fanout import FanoutAdds
from kestrel.item import QItem
from kestrel.journal.batch import WriteCoalescer
from kestrel.journal.chores import Chore
from kestrel.journal.interface import IJournal
from kestrel.journal.journal import FileJournal
from kestrel.journal.memory import MemoryJournal
from kestrel.journal.runner import SyncTurn, run_inline
from kestrel.journal.syncfile import FsyncObserver
from kestrel.limits import check_room, descriptors_for
from kestrel.loading import REPLAY_SLICE_SECONDS, REPLAY_STEP_BYTES, JournalLoader, LoadingQueue
from kestrel.names import FANOUT_SEPARATOR, master_name, validate_queue_name
from kestrel.queue import PersistentQueue, QueueObserver
from kestrel.queue_folder import ensure_queue_path, refuse_foreign_journal
from kestrel.queue_info import QueueInfo
from kestrel.settled import in_deferred, settled
from kestrel.stats import ServerStats, StatList, physical_memory_bytes
from kestrel.status import ServerStatus
from kestrel.unsynced import Answer

T = TypeVar("T")
RunInThread = Callable[[Callable[[], T]], Deferred]

#: Gives the observer of each queue as it is created (by name), or C{None} for none.
QueueObserverFactory = Callable[[str], QueueObserver | None]

class QueueCollection(ExpirySweeps, Service):
    """
    Every queue of the server, created on first reference.

    Public operations raise L{ShuttingDown} once C{stopService} has begun
    (except C{unremove} and C{confirm_remove}, which become no-ops: a queue
    that is closing keeps its open reads, and replay returns them).

    An C{on_fsync} observer (L{FsyncObserver}: C{(seconds, write_delays)})
    is handed to the journal of every queue created with C{keep_journal}, so
    it hears of every fsync that makes journal writes durable, and
    C{run_in_thread} and C{file_chores} (see L{FileJournal}) to each such
    journal, for its work off the reactor thread. A
    C{queue_observer} factory is asked, by name, for the L{QueueObserver} of
    every queue as it is created (journal rewrite, rotation and read-behind
    times, request and queue sizes). C{on_delete} is called with the name of
    every queue deleted, whether by L{delete} or by the C{max_queue_age}
    sweep (L{delete_expired_queues}), once the queue is closed and erased.

    Startup replay (L{kestrel.loading.JournalLoader}, given the C{replay_*}
    arguments): L{startService} replays every journal before it returns;
    L{start_loading} (the server's) replays them while the server serves.

    @ivar stats: the global counters (L{ServerStats}).
    @ivar config: the L{ServerConfig} in force (replaced by L{reload}).
    """

    _log = Logger()
    name = "queues"

    def __init__(self, config: ServerConfig, clock: IReactorTime, *,
                 run_in_thread: RunInThread | None = None,
                 file_chores: Callable[[Chore], None] | None = None,
                 stats: ServerStats | None = None,
                 status: ServerStatus | None = None,
                 on_fsync: FsyncObserver | None = None,
                 queue_observer: QueueObserverFactory | None = None,
                 on_delete: Callable[[str], object] | None = None,
                 replay_slice_seconds: float = REPLAY_SLICE_SECONDS,
                 replay_step_bytes: int = REPLAY_STEP_BYTES,
                 replay_pause: float = 0.0,
                 replay_timer: Callable[[], float] = time.perf_counter) -> None:
        self.config = config
        self._clock = clock
        self._run_in_thread = run_inline if run_in_thread is None else run_in_thread
        self._sync_turn = SyncTurn(clock) if config.journal_fsync == "reactor" else None
        self._file_chores = file_chores
        self._on_fsync = on_fsync
        self._queue_observer = queue_observer
        #: Called with the name of every deleted queue (see L{delete}); may be set later.
        self.on_delete = on_delete
        self.stats = stats if stats is not None else ServerStats(clock.seconds())
        #: A L{kestrel.status.ServerStatus} (optional): when it reports a
        #: graceful status at stop, empty queues get their journals compacted.
        self.status = status
        self._path = os.fspath(config.queue_path)
        self._archive_path = os.fspath(config.archive_path) if config.archive_path else None
        self._queues: dict[str, PersistentQueue] = {}
        #: The queues served, by name, for lookups per request without a call:
        #: read-only to callers; empty once the collection is stopping.
        self.served_queues: Mapping[str, PersistentQueue] = self._queues
        self._fanouts: dict[str, dict[str, None]] = {}
        self._aliases: dict[str, AliasedQueue] = {}
        self._fanout = FanoutAdds()
        self._pending: set[Deferred] = set()
        #: Holds back the journal writes of a batch (see L{WriteCoalescer}).
        self.write_coalescer = WriteCoalescer()
        self._stopping = False
        self._expiration: LoopingCall | None = None
        # Startup replay (see start_loading): the queues still loading are its loading.
        self._loader = JournalLoader(
            self._path, clock, build=self._build_queue, register=self._register_replayed,
            close=self._close_queue, slice_seconds=replay_slice_seconds,
            step_bytes=replay_step_bytes, pause=replay_pause, timer=replay_timer)
        ensure_queue_path(self._path, getattr(config, "queue_path_mode", 0o700))
        self._apply_aliases()

    # -- lifecycle ---------------------------------------------------------

    def startService(self) -> None:
        """
        Replay every queue found in the queue directory, then start the expiration timer.

        Replay is synchronous: when this returns, every journal has been read
        (L{start_loading} replays while the server serves). A journal that
        cannot be read raises.
        """
        super().startService()
        self._begin_loading()
        self._loader.run_all()
        self._start_expiration()

    def start_loading(self) -> Deferred[None]:
        """
        Start serving now and replay the journals on the reactor thread, in
        slices of about C{replay_slice_seconds} of work with a reactor turn
        between two (C{clock.callLater(replay_pause, ...)}), one queue after
        another, smallest journal first.

        The names of the queues to load are those with journal files in the
        queue directory now. Until its replay is done a queue is "loading"
        (L{loading_names}): requests made of it wait for it (see
        L{kestrel.loading.LoadingQueue}), and L{flush}, L{delete},
        L{flush_expired} and L{flush_all} refuse it with
        L{kestrel.errors.QueueLoading}. A queue with no journal is created
        and served at once. The Deferred is L{when_loaded}'s.
        """
        super().startService()
        self._begin_loading()
        self._start_expiration()
        return self._loader.start()

    def when_loaded(self) -> Deferred[None]:
        """
        A Deferred firing once every queue found at startup is loaded (at
        once if none is loading), or failing with the error that stopped
        the replay of a journal. A stop during replay fires it with
        L{ShuttingDown}.
        """
        return self._loader.when_loaded()

    @property
    def _loading(self) -> dict[str, LoadingQueue]:
        """The queues still loading (see L{JournalLoader.loading})."""
        return self._loader.loading

    def loading_names(self) -> list[str]:
        """Names of the queues whose journal is still being replayed (replay order)."""
        return list(self._loading)

    def queues_loading(self) -> int:
        """How many queues are still loading their journal."""
        return len(self._loading)

    def _begin_loading(self) -> None:
        """List the queues to replay (L{JournalLoader.begin}); register loading fanout children."""
        for name in self._loader.begin():
            if FANOUT_SEPARATOR in name:
                # Adds to the master reach a loading child (they wait for it).
                self._fanouts.setdefault(master_name(name), {})[name] = None

    def _register_replayed(self, name: str, queue: PersistentQueue) -> None:
        """A replayed queue serves (with the config in force: a reload may have come)."""
        queue.config = self.config.queue_config(name)
        self._register(name, queue)

    def stopService(self) -> Deferred[None]:
        """
        Refuse new work, wake every waiter with "no item", wait for pending
        fsyncs, then close every journal.

        The Deferred fires when every journal is closed. When C{status}
        blocks writes (ReadOnly, Quiescent) the journals of empty queues are
        compacted first, as Kestrel's graceful shutdown does.
        """
        super().stopService()
        if self._stopping:
            return succeed(None)
        self._stopping = True
        self.served_queues = {}
        if self._expiration is not None and self._expiration.running:
            self._expiration.stop()
        self._loader.stop(ShuttingDown("the queue collection is shutting down"))
        for queue in self._queues.values():
            queue.evict_waiters()
        graceful = bool(self.status is not None and self.status.graceful_shutdown)
        pending = DeferredList(list(self._pending), consumeErrors=True)

        def close_all(_: object) -> Deferred:
            closing = [self._close_queue(name, queue, graceful)
                       for name, queue in self._queues.items()]
            self._queues.clear()
            return DeferredList(closing, consumeErrors=True)

        d = pending.addCallback(close_all)
        d.addCallback(lambda _: self._log.info("Queues closed"))
        return d

    def _close_queue(self, name: str, queue: PersistentQueue, graceful: bool = False) -> Deferred:
        def failed(f: Failure) -> None:
            self._log.failure("Closing queue {queue} failed", f, queue=name)
        try:
            d = queue.close(graceful)
        except Exception:
            failed(Failure())
            return succeed(None)
        return d.addErrback(failed)

    def _check_running(self) -> None:
        if self._stopping:
            raise ShuttingDown("the queue collection is shutting down")

    def _track(self, d: Deferred[T]) -> Deferred[T]:
        """Remember C{d} until it fires, so that stop waits for it."""
        if not d.called:
            self._pending.add(d)

            def forget(result: object) -> object:
                self._pending.discard(d)
                return result
            d.addBoth(forget)
        return d

    # -- queues ------------------------------------------------------------

    def queue(self, name: str, create: bool = True) -> PersistentQueue | None:
        """
        The queue named C{name}; created (and replayed) if missing and C{create}.

        Raises L{kestrel.errors.InvalidQueueName} for a name that may not be
        created; nothing touches the file system for such a name. Returns
        C{None} for a missing queue when not C{create}, and for a queue still
        loading its journal (L{loading_names}); with C{create}, such a queue
        raises L{QueueLoading}.
        """
        if self._stopping:  # (_check_running's own test, inlined: it runs per read)
            self._check_running()
        queue = self._queues.get(name)
        if queue is not None or not create:
            return queue
        if name in self._loading:
            raise QueueLoading(name)
        return self._create_queue(name)

    def _create_queue(self, name: str) -> PersistentQueue:
        loading = self._loading.get(name)
        if loading is not None:
            # Still replaying: requests wait for it (LoadingQueue answers as a queue does).
            return loading  # type: ignore[return-value]
        validate_queue_name(name)
        check_room(name, len(self._queues) + len(self._loading), self.config.max_queues)
        queue = self._build_queue(name)
        with descriptors_for(name):
            queue.setup()
        self._register(name, queue)
        return queue

    def _build_queue(self, name: str) -> PersistentQueue:
        """A new queue object named C{name} over its journal, not set up (replayed) yet."""
        validate_queue_name(name)
        refuse_foreign_journal(self._path, name)
        config = self.config.queue_config(name)
        if config.keep_journal:
            journal: IJournal = FileJournal(self._path, name, self._clock, config.sync_journal,
                                       archive_path=self._archive_path,
                                       run_in_thread=self._run_in_thread,
                                       chores=self._file_chores, sync_turn=self._sync_turn,
                                       coalescer=self.write_coalescer,
                                       on_fsync=self._on_fsync,
                                       file_mode=self.config.journal_file_mode)
        else:
            # keep_journal: false -- forget whatever an earlier run journaled.
            FileJournal(self._path, name, self._clock, None,
                        archive_path=self._archive_path).erase()
            journal = MemoryJournal()
        observer = None if self._queue_observer is None else self._queue_observer(name)
        queue = PersistentQueue(name, config, journal, self._clock, observer=observer,
                                fsync_failed=self.stats.record_fsync_error)
        self._log.info("Setting up queue {queue}", queue=name)
        self.stats.queue_creates += 1
        return queue

    def _register(self, name: str, queue: PersistentQueue) -> None:
        """Serve C{queue} (set up) under C{name}: fanout registration, expire-to wiring."""
        self._queues[name] = queue
        if FANOUT_SEPARATOR in name:
            master = master_name(name)
            self._fanouts.setdefault(master, {})[name] = None
            self._log.info("Fanout queue {queue} added to {master}", queue=name, master=master)
        if queue.config.expire_to_queue:
            self._wire_expire_to(queue, queue.config.expire_to_queue)

    def _wire_expire_to(self, queue: PersistentQueue, target: str) -> None:
        """
        Send the expired items of C{queue} to queue C{target} (created now).

        They arrive with no expiry and a fresh add time, bypassing the
        target's fanouts and C{total_items}. The target is looked up by name
        at each expiry, so a deleted target is created again.
        """
        try:
            if target not in self._queues:
                self._create_queue(target)
        except ValueError as e:
            self._log.warn("Queue {queue}: cannot expire to {target!r}: {reason}",
                           queue=queue.name, target=target, reason=str(e))
            return

        def expire_to(item: QItem) -> None:
            if self._stopping:
                return
            destination = self._queues.get(target)
            if destination is None:
                destination = self._create_queue(target)
            self._track(destination.add(item.data, 0)).addErrback(
                lambda f: self._log.failure("Expiring into {target} failed", f, target=target))
        queue.expire_to = expire_to

    def queue_names(self, include_aliases: bool = True) -> list[str]:
        """Names of every queue, then (unless told not to) of every alias."""
        names = list(self._queues)
        if include_aliases:
            names.extend(self._aliases)
        return names

    def queue_info(self, name: str) -> QueueInfo | None:
        """The counters of queue C{name} now (L{QueueInfo.of}), or C{None} if not served."""
        self._check_running()
        queue = self._queues.get(name)
        return None if queue is None else QueueInfo.of(queue)

    def alias_names(self) -> list[str]:
        """Names of every alias."""
        return list(self._aliases)

    def alias(self, name: str) -> AliasedQueue | None:
        """The alias named C{name}, or C{None}."""
        return self._aliases.get(name)

    def fanout_children(self, master: str) -> list[str]:
        """The registered fanout children of C{master}, in registration order."""
        return list(self._fanouts.get(master, ()))

    # -- operations --------------------------------------------------------

    def add(self, name: str, data: bytes, expiry_ms: int = 0) -> Deferred[bool]:
        """L{offer}, its answer always in a Deferred."""
        return in_deferred(self.offer(name, data, expiry_ms))

    @overload
    def offer(self, name: str, data: bytes, expiry_ms: int = ...,
              then: None = ...) -> bool | Deferred[bool]: ...

    @overload
    def offer(self, name: str, data: bytes, expiry_ms: int,
              then: Answer | None) -> bool | Deferred[bool] | None: ...

    def offer(self, name: str, data: bytes, expiry_ms: int = 0,
              then: Answer | None = None) -> bool | Deferred[bool] | None:
        """
        Add C{data} to queue C{name} (creating it), to its fanout children, or
        to every destination of the alias C{name}: whether it was stored,
        when that is known at once without a Deferred (a plain queue's add,
        as L{PersistentQueue.offer}), else a Deferred of it; or C{None}, a
        plain queue's durable add given C{then}, which is then called with
        the outcome (as L{PersistentQueue.offer}).

        A master with fanout children answers all or nothing for its
        producer (see L{_add_with_fanouts}): true only once the master and
        every child hold the item. For an alias, true only if every
        destination accepted. C{total_items} counts every accepted add,
        children's included.
        """
        if self._stopping:
            self._check_running()
        if name in self._aliases:
            alias = self._aliases[name]
            alias.put_items += 1
            alias.put_bytes += len(data)
            return DeferredList([self._add_to_destination(dest, data, expiry_ms)
                                 for dest in alias.destinations],
                                consumeErrors=True).addCallback(all_true)
        if name in self._fanouts:
            return self._add_with_fanouts(name, data, expiry_ms)
        return self._add_one(name, data, expiry_ms, then)

    def _add_to_destination(self, name: str, data: bytes, expiry_ms: int) -> Deferred[bool]:
        try:
            return in_deferred(self._add_with_fanouts(name, data, expiry_ms))
        except ValueError as e:
            self._log.warn("Alias destination {queue!r} refused: {reason}", queue=name,
                           reason=str(e))
            return succeed(False)

    def _add_with_fanouts(self, name: str, data: bytes,
                          expiry_ms: int) -> bool | Deferred[bool]:
        """
        Add to master C{name} and to each of its fanout children, all or nothing.

        Fires C{True} only once every child and the master accepted the item
        (each add fires as the queue's own does: after the fsync covering it
        when the queue acknowledges durably). If a child refuses (C{False}:
        full, item too large) the answer is C{False}; if a child's add fails
        (its journal cannot be written, the queue cannot be created) the
        answer is that failure. The queues that took the item keep it: a
        retried add may leave a second copy there (docs/reliability.md).
        """
        children = self._fanouts.get(name)
        if not children:
            return self._add_one(name, data, expiry_ms)
        adds = [self._add_child(name, child, data, expiry_ms) for child in list(children)]
        adds.append(in_deferred(self._add_one(name, data, expiry_ms)))
        return self._fanout.combine(adds)

    def _add_child(self, master: str, child: str, data: bytes, expiry_ms: int) -> Deferred[bool]:
        """Add to fanout child C{child} of C{master}; its refusals are told to the fanout log."""
        try:
            d = in_deferred(self._add_one(child, data, expiry_ms))
        except Exception as e:  # (a queue that cannot be created, a stopping server)
            d = fail(e)
        return self._fanout.watch(master, child, d)

    @overload
    def _add_one(self, name: str, data: bytes, expiry_ms: int,
                 then: None = ...) -> bool | Deferred[bool]: ...

    @overload
    def _add_one(self, name: str, data: bytes, expiry_ms: int,
                 then: Answer | None) -> bool | Deferred[bool] | None: ...

    def _add_one(self, name: str, data: bytes, expiry_ms: int,
                 then: Answer | None = None) -> bool | Deferred[bool] | None:
        queue = self._queues.get(name)
        if queue is None:
            queue = self._create_queue(name)
        answer = queue.offer(data, expiry_ms, then)
        # Counted once stored, as the queue counts its own: at once, or for
        # a durable add (still waiting) once written; a stop closes the
        # journals, whose last fsync answers it.
        if answer is True or answer is None or (answer is not False and (
                not answer.called or answer.result is True)):
            self.stats.total_items += 1
        return answer

    def remove(self, name: str, deadline: float | None = None, open_read: bool = False,
               peek: bool = False, held: bool = False) -> Deferred[QItem | None]:
        """
        Take (or, with C{peek}, look at) the head of queue C{name}, waiting until
        C{deadline} (clock seconds; C{None}: no wait) for one to arrive.

        An alias reads as an empty queue and creates nothing. With
        C{open_read} the item is an open read (its C{xid} set); with C{held}
        too, one held for a plain read's reply, which the queue's
        C{transactions} does not count. Cancelling the Deferred withdraws the
        wait. Counts C{get_hits} / C{get_misses}.
        """
        return in_deferred(self.take(name, deadline, open_read, peek, held))

    def take(self, name: str, deadline: float | None = None, open_read: bool = False,
             peek: bool = False,
             held: bool = False) -> QItem | None | Deferred[QItem | None]:
        """
        As L{remove}, but an answer known at once (the item, or C{None}) is
        returned as it is, without a Deferred: the Deferred returned, if
        any, has not fired, or failed.
        """
        if self._stopping:
            self._check_running()
        if name in self._aliases:
            return None
        queue = self._queues.get(name)
        if queue is None:
            queue = self._create_queue(name)
        d = queue.wait_peek(deadline) if peek else queue.take(deadline, open_read)
        # Answered at once (the usual read: an item taken, no Deferred): count
        # now, no callback chain. (Not isinstance(d, Deferred): Deferred is an
        # ABC, whose check costs a Python call.)
        if type(d) is not QItem:
            result = settled(d)
        else:
            result = d
        if result is None:
            self.stats.get_misses += 1
            return None
        if result.__class__ is QItem:
            self.stats.get_hits += 1
            if held:
                queue.transactions -= 1
            return result
        assert isinstance(d, Deferred)  # (a QItem was returned above)
        d.addCallback(self._count_get)
        if held:
            d.addCallback(self._uncount_transaction, name)
        return d

    def _uncount_transaction(self, item: QItem | None, name: str) -> QItem | None:
        """An open read held for a plain read's reply is no client transaction."""
        queue = self._queues.get(name)
        if item is not None and queue is not None:
            queue.transactions -= 1
        return item

    def _count_get(self, item: QItem | None) -> QItem | None:
        if item is None:
            self.stats.get_misses += 1
        else:
            self.stats.get_hits += 1
        return item

    def unremove(self, name: str, xid: int) -> None:
        """Return open read C{xid} to the head of C{name}; no-op if the queue is gone."""
        queue = None if self._stopping else self._queues.get(name)
        if queue is not None:
            queue.unremove(xid)

    def confirm_remove(self, name: str, xid: int) -> None:
        """Confirm open read C{xid} of C{name}; no-op if the queue is gone."""
        queue = None if self._stopping else self._queues.get(name)
        if queue is not None:
            queue.confirm_remove(xid)

    def confirm_read(self, name: str, xid: int) -> Deferred[None] | None:
        """A client's confirm: a durable queue's Deferred (L{PersistentQueue.confirm_durably})."""
        queue = None if self._stopping else self._queues.get(name)
        if queue is not None:
            if queue.acks_durably:
                return self._track(queue.confirm_durably(xid))
            queue.confirm_remove(xid)
        return None

    def flush(self, name: str) -> None:
        """Remove every item of queue C{name}; a missing queue or an alias is left alone."""
        self._check_running()
        queue = self._queues.get(name)
        if queue is not None:
            queue.flush()
            self._log.info("Queue {queue} flushed", queue=name)
        elif name in self._loading:
            raise QueueLoading(name, "flush")

    def flush_all(self) -> None:
        """Flush every queue (not aliases); refused (L{QueueLoading}) while one is loading."""
        if self._loading:
            raise QueueLoading(next(iter(self._loading)), "flush_all", len(self._loading) - 1)
        for name in self.queue_names(include_aliases=False):
            self.flush(name)

    def delete(self, name: str) -> None:
        """
        Delete queue C{name}: its waiters get "no item", its journal files are
        erased at once, its stats dropped; a fanout child is unregistered.
        Then C{on_delete(name)} is called (if set), for a queue that existed.

        A missing queue or an alias is a no-op. A later reference creates an
        empty queue. Open reads on it become no-ops.
        """
        self._check_running()
        if name in self._loading:
            raise QueueLoading(name, "delete")
        queue = self._queues.pop(name, None)
        if queue is not None:
            queue.evict_waiters()
            self._track(queue.close()).addErrback(lambda f: self._log.failure(
                "Closing deleted queue {queue} failed", f, queue=name))
            queue.destroy_journal()
            self.stats.queue_deletes += 1
            self._log.info("Queue {queue} deleted", queue=name)
            if self.on_delete is not None:
                try:
                    self.on_delete(name)
                except Exception:
                    self._log.failure("on_delete observer failed for {queue}", queue=name)
        if FANOUT_SEPARATOR in name:
            children = self._fanouts.get(master_name(name))
            self._fanout.forget(name)
            if children is not None and name in children:
                del children[name]
                if not children:
                    del self._fanouts[master_name(name)]
                self._log.info("Fanout queue {queue} dropped from {master}", queue=name,
                               master=master_name(name))

    def evict_waiters(self) -> None:
        """Wake every waiting read of every queue with "no item"."""
        for queue in self._queues.values():
            queue.evict_waiters()

    # -- configuration -----------------------------------------------------

    def reload(self, config: ServerConfig) -> None:
        """
        Apply C{default}, C{queues} and C{aliases} of C{config} in place.

        Every existing queue gets its recomputed config; aliases are created,
        updated, or (unlike Kestrel) removed. Server-level fields (paths,
        ports, timer frequency) need a restart. The expire-to target of an
        existing queue is not re-resolved, as in Kestrel.
        """
        self.config = config
        for name, queue in self._queues.items():
            queue.config = config.queue_config(name)
            self._log.info("Reloaded queue config {queue}", queue=name)
        self._apply_aliases()

    def _apply_aliases(self) -> None:
        apply_aliases(self._aliases, self.config.aliases, self.config.queues,
                      self._clock.seconds())

    # -- stats -------------------------------------------------------------

    def dump_stats(self, name: str) -> StatList:
        """
        Per-queue stats of C{name} in Kestrel's order (plus C{children} for a
        master with registered fanouts), alias stats for an alias, [] otherwise.
        """
        queue = self._queues.get(name)
        if queue is not None:
            stats = list(queue.dump_stats())
            children = self._fanouts.get(name)
            if children:
                stats.append(("children", ",".join(children)))
            return stats
        alias = self._aliases.get(name)
        if alias is not None:
            return alias.dump_stats()
        return []

    def current_items(self) -> int:
        """Items in every queue (open reads excluded)."""
        return sum(q.length for q in self._queues.values())

    def current_bytes(self) -> int:
        """Payload bytes in every queue."""
        return sum(q.bytes for q in self._queues.values())

    def reserved_memory_ratio(self) -> float:
        """Sum of every queue's C{max_memory_size} over the machine's physical memory."""
        memory = physical_memory_bytes()
        if not memory:
            return 0.0
        return sum(q.config.max_memory_size for q in self._queues.values()) / memory
