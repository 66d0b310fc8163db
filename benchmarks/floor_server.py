"""
The least a Twisted memcache queue server costs per request on this machine.

Not part of the server, and not a benchmark by itself: `benchmarks/cost.py
--floor` runs it beside txkestrel as the server "twisted-floor", to show how
much of txkestrel's CPU per request is the reactor's and the kernel's socket
work, which no change inside txkestrel's protocol or queue code can remove.
It answers `set <q> <flags> <exptime> <bytes>` with STORED and `get <q>` with
the oldest item of an in-memory FIFO (or END), one request per line;
Kestrel's reliable read as well, `get <q>/open` (the oldest item, held open
by the connection: one per queue) and `get <q>/close` (the open item is
gone; END), the least of what `cost.py`'s reliable-1 asks. It uses
the same reply path as txkestrel (`kestrel.protocols.base.write_now`) and the
same reactor (`kestrel.reactor`; `--reactor epoll` for Twisted's own, run by
`cost.py --epoll` as "twisted-floor-epoll"; `--reactor none` for a bare
`select.epoll` loop without Twisted, run by `cost.py --python-floor` as
"python-floor": the least any Python server costs). No metrics, no
sessions, no limits, no expiry, no stats: do not use it for anything else.

Every variant freezes what it made to start out of the garbage
collector's reach (`gc.freeze`), as txkestrel does once its queues are
loaded, so that no full collection walks those objects again.

With `--journal DIR` (`cost.py --journal-floor`, as "journal-floor") it also
appends each set's ADDX record and each hit's REMOVE (an open's
REMOVE_TENTATIVE_XID, a close's CONFIRM_REMOVE) to a file per queue in DIR,
one `write` each, as txkestrel's journal does under `sync_journal:
never` (no rotation, no replay): the least a server costs that journals
every request in Kestrel's format before it replies.

With `--durable` as well (`cost.py --durable-floor`, as "durable-floor" and,
without Twisted, "durable-python-floor") the journal is made durable the way
txkestrel's reactor-turn fsync does it, only barer: the records of every
request served in one reactor turn are appended with one `write` per queue
at the end of the turn, then one `fsync` per queue, and only then are the
turn's replies sent (one send per connection). That is the least a Python
server costs per durable enqueue on this machine: the floor of `durable-N`.

With `--bookkeeping` as well (`cost.py --bookkeeping-floor`, as
"bookkeeping-floor") every request also does, in the fewest Python steps,
what a Kestrel queue must do per request and the journal floors leave out.
A set finds the queue's books by name (a new name checked as txkestrel
checks it: `kestrel.names.decode_queue_name`), checks Kestrel's limits
(`max_items`, `max_size`, `max_item_size`), makes an item with its add time
and expiry (`kestrel.item.QItem`, the expiry as `memcache_expiry_ms` reads
it), counts Kestrel's counters (`cmd_set`, `total_items` in txkestrel's
`ServerStats`; per queue `items`, `bytes`, `mem_bytes`, `total_items`,
`put_items`, `put_bytes`) and records Kestrel's metrics in txkestrel's own
histograms (`kestrel.metrics`: `request_size`, `queue_size`,
`set_latency_usec` until the reply; with `--durable`,
`item_fsync_delay_usec` and `fsync_delay_usec`), all settled once a second.
With `--durable` the item is unseen by readers until its turn's fsync is
done; without, its record is written and it is seen at once. A get (plain,
`/open`, `/close`) discards expired head items (`expired_items`), counts
`cmd_get`, `get_hits` or `get_misses`, per queue `get_items_hit` or
`get_items_miss`, `items`, `bytes`, `mem_bytes`, `age`, and for an open
read `transactions` and the open reads, and records `get_hit_latency_usec`
or `get_miss_latency_usec`, `delivery_latency_msec`, `queue_size`, and for
an open or a close `tx_map_size` and `tx_expire_list_size`. No layers,
Deferreds, sessions, error handling or upkeep checks, and no holding of a
plain read until its reply is in the kernel (txkestrel's own promise, not
Kestrel's): the least a request costs in Python with Kestrel's
bookkeeping, the floor that txkestrel's own layering sits on (in
`durable-N` with `--durable`; one request at a time without). Only on a
Twisted reactor.

    python3 benchmarks/floor_server.py [--reactor kestrel|epoll|none] PORT
    python3 benchmarks/floor_server.py [--reactor ...] --journal DIR [--durable] PORT
    python3 benchmarks/floor_server.py [--reactor kestrel|epoll] --journal DIR [--durable] \
        --bookkeeping PORT
"""

from __future__ import annotations

import argparse
import gc
import os
import select
import socket
import sys
import time
from collections import defaultdict, deque
from collections.abc import Callable
from itertools import count
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from twisted.internet.protocol import Factory, Protocol  # noqa: E402

from kestrel.item import QItem, memcache_expiry_ms  # noqa: E402
from kestrel.journal.records import REMOVE_BYTES, Opcode, encode_add, encode_xid  # noqa: E402
from kestrel.metrics import SETTLE_INTERVAL, Metrics, QueueMetrics  # noqa: E402
from kestrel.names import decode_queue_name  # noqa: E402
from kestrel.protocols.base import write_now  # noqa: E402
from kestrel.stats import ServerStats  # noqa: E402

QUEUES: defaultdict[bytes, deque[bytes | QItem]] = defaultdict(deque)

#: The xids of reliable reads (one counter for every queue: the floor never replays).
XIDS = count(1)

#: A connection's open reads: (xid, item) per queue (bare name).
OpenReads = dict[bytes, tuple[int, Any]]

#: With --journal: the folder, and the open journal file of each queue.
JOURNAL_DIR: str | None = None
JOURNALS: dict[bytes, int] = {}


def journal_fd(queue: bytes) -> int:
    """The append-only journal file of C{queue} in L{JOURNAL_DIR} (opened once)."""
    fd = JOURNALS.get(queue)
    if fd is None:
        assert JOURNAL_DIR is not None
        path = os.path.join(JOURNAL_DIR, queue.hex())
        fd = JOURNALS[queue] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    return fd


#: With --durable: the records of this turn per queue, and the replies each
#: connection waits for (sent once the turn's fsyncs are done).
DURABLE = False
TURN_RECORDS: defaultdict[bytes, list[bytes]] = defaultdict(list)
TURN_REPLIES: list[tuple[Callable[[bytes], object], bytes]] = []


def end_turn() -> None:
    """Write and fsync the turn's records (one write and fsync per queue), then reply."""
    for queue, records in TURN_RECORDS.items():
        fd = journal_fd(queue)
        os.write(fd, b"".join(records))
        started = time.time() if BOOKKEEPING else 0.0
        os.fsync(fd)
        if BOOKKEEPING:
            BOOKS[queue].synced(started)
    TURN_RECORDS.clear()
    if TURN_SETS:
        now = time.time()
        for add, started in TURN_SETS:
            add((now - started) * 1e6)
        TURN_SETS.clear()
    replies = TURN_REPLIES[:]
    TURN_REPLIES.clear()
    for send, data in replies:
        send(data)


def record(queue: bytes, data: bytes) -> None:
    """Journal C{data} for C{queue}: at once, or (--durable) at the end of the turn."""
    if DURABLE:
        TURN_RECORDS[queue].append(data)
    else:
        os.write(journal_fd(queue), data)


#: With --bookkeeping: what a Kestrel queue keeps and counts per request.
BOOKKEEPING = False
#: Kestrel's limits on a queue (its defaults: no limit).
MAX_ITEMS = 2**31 - 1
MAX_SIZE = 2**63 - 1
MAX_ITEM_SIZE = 2**63 - 1
#: Every histogram (txkestrel's own), settled every SETTLE_INTERVAL seconds.
METRICS = Metrics()
#: With --bookkeeping: the histogram and start time of each set answered this turn.
TURN_SETS: list[tuple[Callable[[float], None], float]] = []


#: txkestrel's server-wide counters (a set moves C{cmd_set} and C{total_items}).
STATS = ServerStats(time.time())


class QueueBooks:
    """
    What a Kestrel queue keeps and counts per request, and nothing more:
    its counters, its metrics and its items. A durable add (--durable) is
    unseen by readers until the turn's fsync is done (L{synced}); otherwise
    its record is written and it is seen at once.
    """

    __slots__ = ("key", "name", "fifo", "unseen", "write_times", "metrics", "length", "bytes",
                 "memory_bytes", "total_items", "put_items", "put_bytes", "get_items_hit",
                 "get_items_miss", "expired_items", "transactions", "open_reads", "age_ms")

    def __init__(self, name: bytes) -> None:
        self.key = name
        self.name = decode_queue_name(name)
        self.fifo: deque[QItem] = QUEUES[name]  # type: ignore[assignment]
        self.unseen: list[QItem] = []
        self.write_times: list[float] = []
        self.metrics: QueueMetrics = METRICS.queue(self.name)
        self.length = self.bytes = self.memory_bytes = 0
        self.total_items = self.put_items = self.put_bytes = 0
        self.get_items_hit = self.get_items_miss = self.expired_items = 0
        self.transactions = self.open_reads = self.age_ms = 0

    def add(self, data: bytes, exptime: int) -> bytes:
        """Keep and count an add of C{data}; return its reply."""
        now = time.time()
        size = len(data)
        STATS.cmd_set += 1
        if size > MAX_ITEM_SIZE or self.length >= MAX_ITEMS or self.bytes + size > MAX_SIZE:
            return b"NOT_STORED\r\n"
        now_ms = int(now * 1000)
        item = QItem(data, now_ms, memcache_expiry_ms(exptime, now_ms) if exptime else 0)
        record = encode_add(data, now_ms, item.expiry_ms)
        if DURABLE:
            TURN_RECORDS[self.key].append(record)
            self.unseen.append(item)
            self.write_times.append(now)
        else:
            os.write(journal_fd(self.key), record)
            self.fifo.append(item)
        self.length += 1
        self.bytes += size
        self.memory_bytes += size
        self.total_items += 1
        self.put_items += 1
        self.put_bytes += size
        STATS.total_items += 1
        metrics = self.metrics
        metrics.request_size.add(size)
        metrics.queue_size.add(self.length)
        if DURABLE:
            TURN_SETS.append((metrics.set_latency_usec.add, now))
        else:
            metrics.set_latency_usec.add((time.time() - now) * 1e6)
        return b"STORED\r\n"

    def synced(self, started: float) -> None:
        """The fsync started at C{started} is done: record it; readers may have the items."""
        now = time.time()
        METRICS.record_fsync(now - started, [now - t for t in self.write_times])
        self.write_times.clear()
        self.fifo.extend(self.unseen)
        self.unseen.clear()

    def take(self, key: bytes, open_read: bool) -> tuple[bytes, QItem | None]:
        """
        Remove the live head item (expired ones are discarded first, each
        journaled as a REMOVE) for a get of C{key}; with C{open_read}, as
        an open read under a fresh xid (C{item.xid}). Counted and recorded
        as Kestrel does: the reply and the item, or END and C{None}.
        """
        now = time.time()
        STATS.cmd_get += 1
        fifo = self.fifo
        now_ms = int(now * 1000)
        item = None
        while fifo:
            head = fifo.popleft()
            size = len(head.data)
            self.length -= 1
            self.bytes -= size
            self.memory_bytes -= size
            if not head.expiry_ms or head.expiry_ms >= now_ms:
                item = head
                break
            self.expired_items += 1
            record(self.key, REMOVE_BYTES)
        metrics = self.metrics
        if item is None:
            STATS.get_misses += 1
            self.get_items_miss += 1
            metrics.get_miss_latency_usec.add((time.time() - now) * 1e6)
            return b"END\r\n", None
        STATS.get_hits += 1
        self.get_items_hit += 1
        wait_ms = now_ms - item.add_time_ms
        self.age_ms = wait_ms if wait_ms > 0 else 0
        if open_read:
            self.transactions += 1
            self.open_reads += 1
            item.xid = xid = next(XIDS)
            record(self.key, encode_xid(Opcode.REMOVE_TENTATIVE_XID, xid))
            metrics.tx_map_size.add(self.open_reads)
            metrics.tx_expire_list_size.add(0)
        else:
            record(self.key, REMOVE_BYTES)
        metrics.queue_size.add(len(fifo))
        done = time.time()
        metrics.get_hit_latency_usec.add((done - now) * 1e6)
        metrics.delivery_latency_msec.add(done * 1000 - item.add_time_ms)
        data = item.data
        return b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key, len(data), data), item

    def confirm(self, xid: int) -> None:
        """Confirm open read C{xid}: journaled, and the open reads recorded."""
        self.open_reads -= 1
        record(self.key, encode_xid(Opcode.CONFIRM_REMOVE, xid))
        self.metrics.tx_map_size.add(self.open_reads)
        self.metrics.tx_expire_list_size.add(0)

    def give_back(self, item: QItem) -> None:
        """An open read's connection has gone: its item is back at the head."""
        size = len(item.data)
        self.open_reads -= 1
        self.fifo.appendleft(QItem(item.data, item.add_time_ms, item.expiry_ms))
        self.length += 1
        self.bytes += size
        self.memory_bytes += size


#: With --bookkeeping: each queue's books, by name.
BOOKS: dict[bytes, QueueBooks] = {}


def books_of(name: bytes) -> QueueBooks:
    """The books of queue C{name}, opened on its first set (the name checked as txkestrel does)."""
    books = BOOKS.get(name)
    if books is None:
        books = BOOKS[name] = QueueBooks(name)
    return books


#: The listen() backlog, txkestrel's default `listen_backlog`.
BACKLOG = 1024


def answer(buf: bytes, opened: OpenReads) -> tuple[bytes, bytes]:
    """
    Serve every complete set/get in C{buf}, for a connection whose open
    reads are C{opened}: (all their replies, the incomplete rest).
    """
    out = []
    pos = 0
    while True:
        nl = buf.find(b"\r\n", pos)
        if nl < 0:
            break
        words = buf[pos:nl].split()
        if words and words[0] == b"set" and len(words) >= 5:
            end = nl + 2 + int(words[4])
            if len(buf) < end + 2:
                break
            data = buf[nl + 2:end]
            pos = end + 2
            if BOOKKEEPING:
                out.append(books_of(words[1]).add(data, int(words[3])))
                continue
            if JOURNAL_DIR is not None:
                record(words[1], encode_add(data, int(time.time() * 1000), 0))
            QUEUES[words[1]].append(data)
            out.append(b"STORED\r\n")
        elif words and words[0] == b"get" and len(words) >= 2:
            if BOOKKEEPING:
                out.append(booked_read(words[1], opened))
            elif b"/" in words[1]:
                out.append(reliable_read(words[1], opened))
            elif q := QUEUES.get(words[1]):
                item: Any = q.popleft()
                if JOURNAL_DIR is not None:
                    record(words[1], REMOVE_BYTES)
                out.append(b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (words[1], len(item), item))
            else:
                out.append(b"END\r\n")
            pos = nl + 2
        else:
            out.append(b"ERROR\r\n")
            pos = nl + 2
    return (out[0] if len(out) == 1 else b"".join(out)), buf[pos:]


def reliable_read(key: bytes, opened: OpenReads) -> bytes:
    """
    The reply to C{get <key>} for C{<q>/open} (the head, held open; END if
    the queue is empty or this connection holds one of it open) or
    C{<q>/close} (the open item is gone: END); anything else, END.
    """
    name, _, option = key.partition(b"/")
    if option == b"open":
        q = QUEUES.get(name)
        if not q or name in opened:
            return b"END\r\n"
        item: Any = q.popleft()
        xid = next(XIDS)
        opened[name] = (xid, item)
        if JOURNAL_DIR is not None:
            record(name, encode_xid(Opcode.REMOVE_TENTATIVE_XID, xid))
        return b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key, len(item), item)
    if option == b"close":
        closed = opened.pop(name, None)
        if closed is not None and JOURNAL_DIR is not None:
            record(name, encode_xid(Opcode.CONFIRM_REMOVE, closed[0]))
    return b"END\r\n"


def booked_read(key: bytes, opened: OpenReads) -> bytes:
    """
    The reply to C{get <key>} with Kestrel's books (--bookkeeping): a plain
    get, C{<q>/open} (END if this connection holds one of the queue open
    already) or C{<q>/close} (END); anything else, END.
    """
    name, _, option = key.partition(b"/")
    if not option:
        return books_of(name).take(key, False)[0]
    if option == b"open":
        if name in opened:
            return b"END\r\n"
        reply, item = books_of(name).take(key, True)
        if item is not None:
            opened[name] = (item.xid, item)
        return reply
    if option == b"close":
        closed = opened.pop(name, None)
        if closed is not None:
            books_of(name).confirm(closed[0])
    return b"END\r\n"


def give_back(opened: OpenReads) -> None:
    """A connection has gone: its open items are back at the head of their queues."""
    for name, (_, item) in opened.items():
        if BOOKKEEPING:
            books_of(name).give_back(item)
        else:
            QUEUES[name].appendleft(item)
    opened.clear()


class FloorProtocol(Protocol):
    """Serve every complete set/get in the buffer; one write of all replies."""

    def __init__(self) -> None:
        self.buf = b""
        self.opened: OpenReads = {}

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted hook
        """Parse and answer what is complete; keep the rest."""
        replies, self.buf = answer(self.buf + data if self.buf else data, self.opened)
        if not replies:
            return
        if DURABLE:
            if not TURN_REPLIES:
                from twisted.internet import reactor
                reactor.callLater(0, end_turn)  # type: ignore[attr-defined]
            TURN_REPLIES.append((self.send, replies))
        else:
            write_now(self.transport, replies)

    def send(self, replies: bytes) -> None:
        """Send C{replies} now."""
        write_now(self.transport, replies)

    def connectionLost(self, reason: object = None) -> None:  # noqa: N802 - Twisted hook
        """Give back the items this connection held open."""
        give_back(self.opened)


def serve_without_twisted(port: int) -> None:
    """
    The same server as a bare C{select.epoll} loop (no Twisted): the least
    any Python event loop costs. Replies are sent with one C{send}; a client
    that does not read them all is dropped (the benchmark clients read).
    """
    listener = socket.create_server(("127.0.0.1", port), backlog=BACKLOG)
    listener.setblocking(False)
    poller = select.epoll()
    poller.register(listener.fileno(), select.EPOLLIN)
    connections: dict[int, tuple[socket.socket, list[bytes], OpenReads]] = {}
    while True:
        if TURN_REPLIES:
            end_turn()
        for fd, _ in poller.poll():
            if fd == listener.fileno():
                client, _ = listener.accept()
                client.setblocking(False)
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                connections[client.fileno()] = (client, [b""], {})
                poller.register(client.fileno(), select.EPOLLIN)
                continue
            client, held, opened = connections[fd]
            try:
                data = client.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                replies, held[0] = answer(held[0] + data if held[0] else data, opened)
                if DURABLE and replies:
                    TURN_REPLIES.append((client.send, replies))
                    continue
                try:
                    if not replies or client.send(replies) == len(replies):
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    pass
            poller.unregister(fd)
            del connections[fd]
            give_back(opened)
            client.close()


def main() -> None:
    """Listen on the loopback port given until stopped."""
    parser = argparse.ArgumentParser(
        description="A bare Twisted memcache queue (set, get, get q/open, get q/close; in "
                    "memory, journaled only with --journal): the floor of what a Twisted "
                    "server costs per request. For benchmarks only.")
    parser.add_argument("port", type=int, help="loopback TCP port to listen on")
    parser.add_argument("--reactor", choices=["kestrel", "epoll", "none"], default="kestrel",
                        help="txkestrel's reactor (kestrel.reactor), Twisted's epoll reactor, "
                             "or none: a bare select.epoll loop without Twisted")
    parser.add_argument("--journal", metavar="DIR",
                        help="append each set's ADDX and each hit's REMOVE record to a file "
                             "per queue in DIR (one write each, no fsync)")
    parser.add_argument("--durable", action="store_true",
                        help="with --journal: one write and one fsync per queue per reactor "
                             "turn, before the turn's replies are sent")
    parser.add_argument("--bookkeeping", action="store_true",
                        help="with --journal, on a Twisted reactor: per request, also what a "
                             "Kestrel queue keeps and counts (limits, an item with its times, "
                             "expiry, counters, metrics settled once a second; with --durable, "
                             "unseen until the fsync)")
    args = parser.parse_args()
    if args.durable and not args.journal:
        parser.error("--durable needs --journal")
    if args.bookkeeping and (not args.journal or args.reactor == "none"):
        parser.error("--bookkeeping needs --journal and a Twisted reactor")
    global JOURNAL_DIR, DURABLE, BOOKKEEPING
    JOURNAL_DIR = args.journal
    DURABLE = args.durable
    BOOKKEEPING = args.bookkeeping
    # (what it made to start is long-lived: out of the collector's reach, as
    # txkestrel's once its queues are loaded)
    gc.freeze()
    if args.reactor == "none":
        serve_without_twisted(args.port)
        return
    if args.reactor == "kestrel":
        from kestrel.reactor import install

        install()
    from twisted.internet import reactor

    if BOOKKEEPING:
        from twisted.internet.task import LoopingCall

        LoopingCall(METRICS.settle).start(SETTLE_INTERVAL, now=False)
    factory = Factory.forProtocol(FloorProtocol)
    reactor.listenTCP(args.port, factory, backlog=BACKLOG, interface="127.0.0.1")  # type: ignore[attr-defined]
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
