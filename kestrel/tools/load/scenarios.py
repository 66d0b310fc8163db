"""
Kestrel's load tests, one function per C{kestrel-load} subcommand: flood,
put-many, many-clients, packing and leaky-reader.

Each takes the parsed command line and an L{Output}, drives the server with
the blocking clients of L{kestrel.tools.load.clients}, prints Kestrel's
summary lines plus latency percentiles, and returns the exit status.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from kestrel.metrics import Histogram
from kestrel.tools.load.clients import (
    END,
    STORED,
    Connection,
    LoadError,
    Output,
    ThriftClient,
    flush_first,
    get_until,
    latency_line,
    mc_get,
    mc_set,
    mc_value,
    merged,
    monitor_if_asked,
    run_threads,
    send_expecting,
    thrift_put_until,
    timed,
)

#: Filler text for put-many and many-clients items (Kestrel used a song lyric).
FILLER = (
    "the queue keeps every letter that you send\n"
    "it holds them through the night and through the crash\n"
    "a journal line for each, from start to end\n"
    "and hands them back in order, none to lose\n"
)


# -- flood


def flood(args: argparse.Namespace, out: Output) -> int:
    """Producers and consumers flood C{-n} items through one queue; report throughput."""
    data = b"x" * 1024 * args.kilobytes
    queue, rollup = args.queue, args.rollup
    flush_first(args, [queue], out)
    put_times: list[Histogram] = []
    get_times: list[Histogram] = []

    def produce(n: int) -> None:
        h = Histogram()
        put_times.append(h)
        if args.thrift:
            client = ThriftClient(args.host, args.port)
            thrift_put_until(client, queue, n, rollup, lambda i: [data] * rollup, h)
            client.close()
            return
        conn = Connection(args.host, args.port)
        send_expecting(conn, mc_set(queue, data) * rollup, STORED * rollup, n, rollup, h)
        conn.close()

    def consume(n: int) -> int:
        h = Histogram()
        get_times.append(h)
        misses = count = 0
        if args.thrift:
            client = ThriftClient(args.host, args.port)
            while count < n:
                want = min(rollup, n - count)
                timeout = 1000 if (args.blocking or rollup > 1) else 0
                t0 = time.perf_counter_ns()
                items = client.get(queue, want, timeout, 0)
                timed(h, t0)
                if not items:
                    misses += 1
                for item in items:
                    if item.data != data:
                        raise LoadError(f"Unexpected response at {count}!")
                    count += 1
            client.close()
            return misses
        conn = Connection(args.host, args.port)
        if rollup == 1:
            request = mc_get(queue, 1000 if args.blocking else None)
            misses = get_until(conn, queue, request, n, lambda i: data, h)
        else:
            while count < n:
                want = min(rollup, n - count)
                t0 = time.perf_counter_ns()
                conn.send(b"monitor %s 1 %d\r\n" % (queue.encode(), want))
                got = 0
                while conn.expect_item(queue, data, count + got):
                    got += 1
                timed(h, t0)
                if got:
                    conn.send(b"confirm %s %d\r\n" % (queue.encode(), got))
                    conn.expect(END, count)
                    count += got
                else:
                    misses += 1
        conn.close()
        return misses

    if args.prefill > 0:
        out(f"prefill: {args.prefill} items of {args.kilobytes}kB")
        produce(args.prefill)

    per_producer = max(1, (args.items + args.producers - 1) // args.producers)
    if rollup > 1 and per_producer % rollup:
        per_producer += rollup - per_producer % rollup
    per_consumer = max(1, args.items // args.consumers)
    if rollup > 1 and per_consumer % rollup:
        per_consumer += rollup - per_consumer % rollup
    out(f"flood: producers={args.producers} each sending {per_producer} items "
        f"(in chunks of {rollup}) of {args.kilobytes}kB to {queue}")
    out(f"flood: consumers={args.consumers} each reading {per_consumer} items "
        f"(in chunks of {rollup}) from {queue}")
    monitor_if_asked(args, queue, out)
    put_times.clear()
    get_times.clear()
    targets: list[Callable[[], Any]] = [lambda: produce(per_producer)] * args.producers
    targets += [lambda: consume(per_consumer)] * args.consumers
    results, duration = run_threads(targets)
    misses = sum(r for r in results[args.producers:])
    out(f"Finished in {int(duration)} msec "
        f"({duration * 1000.0 / (args.items * args.consumers):.1f} usec/put throughput).")
    out(f"Consumer(s) spun {misses} times in misses.")
    out(latency_line("put", merged(put_times)))
    out(latency_line("get", merged(get_times)))
    return 0


# -- put-many


def put_many(args: argparse.Namespace, out: Output) -> int:
    """C{-c} clients put C{-n} items (and get them back with C{-g}); report a latency histogram."""
    clients, rollup = args.clients, args.rollup
    data = (FILLER * (args.bytes // len(FILLER) + 1)).encode()[:args.bytes]
    names = [args.queue + (str(i % args.queues) if args.queues > 1 else "")
             for i in range(clients)]
    flush_first(args, list(dict.fromkeys(names)), out)
    per_client = args.items // clients
    total = per_client * clients
    failures = [0]

    def session(name: str, h: Histogram, getting: bool) -> None:
        if args.thrift:
            client = ThriftClient(args.host, args.port, failures)
            if getting:
                i = 0
                while i < per_client:
                    t0 = time.perf_counter_ns()
                    items = client.get(name, rollup, 0, 0)
                    timed(h, t0)
                    if len(items) != rollup or any(it.data != data for it in items):
                        raise LoadError(f"Unexpected response at {i}!")
                    i += rollup
            else:
                thrift_put_until(client, name, per_client, rollup, lambda i: [data] * rollup, h)
            client.close()
            return
        conn = Connection(args.host, args.port, failures)
        if getting:
            request, expected = mc_get(name) * rollup, mc_value(name, data) * rollup
        else:
            request, expected = mc_set(name, data) * rollup, STORED * rollup
        send_expecting(conn, request, expected, per_client, rollup, h)
        conn.close()

    def cycle(getting: bool) -> None:
        timings = [Histogram() for _ in range(clients)]
        _, duration = run_threads([
            partial(session, names[i], timings[i], getting) for i in range(clients)])
        out(f"Finished in {int(duration)} msec "
            f"({duration * 1000.0 / max(1, total):.1f} usec/put throughput).")
        if failures[0]:
            out(f"Had to retry {failures[0]} times to make all connections.")
        h = merged(timings)
        stats = [("min", h.minimum), ("max", h.maximum)] + [
            (label, h.percentile(q)) for label, q in
            [("p50", 0.5), ("p75", 0.75), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99),
             ("p999", 0.999), ("p9999", 0.9999)]]
        out("Distribution in usec: " + " ".join(f"{k}={v}" for k, v in stats))

    out(f"Put {args.items} items of {args.bytes} bytes in bursts of {rollup} to "
        f"{args.host}:{args.port} in {args.queues} queues named {args.queue} "
        f"using {clients} clients.")
    cycle(False)
    if args.get:
        out(f"Get {args.items} items of {args.bytes} bytes in batches of {rollup} from "
            f"{args.host}:{args.port} in {args.queues} queues named {args.queue} "
            f"using {clients} clients.")
        cycle(True)
    return 0


# -- many-clients


def many_clients(args: argparse.Namespace, out: Output) -> int:
    """One slow producer, many consumers racing with C{/t=1000} gets; every item arrives once."""
    queue, count = args.queue, args.items
    data = FILLER.encode()
    open_reads = args.open_reads or args.kill > 0
    out(f"many-clients: {count} items to {args.host} using {args.clients} clients, "
        f"kill rate {args.kill}%, at {args.sleep} msec/item")
    flush_first(args, [queue], out)
    monitor_if_asked(args, queue, out)
    got = [0]
    lock = threading.Lock()
    set_times = Histogram()
    get_times: list[Histogram] = []

    def consumer() -> None:
        h = Histogram()
        get_times.append(h)
        rng = random.Random()
        request = mc_get(queue, 1000, "/close/open" if open_reads else "")
        conn: Connection | None = None
        while got[0] < count:
            if conn is None:
                conn = Connection(args.host, args.port)
            t0 = time.perf_counter_ns()
            conn.send(request)
            if rng.randrange(100) < args.kill:
                conn.close()
                conn = None
                continue
            if conn.expect_item(queue, data, got[0]):
                timed(h, t0)
                with lock:
                    got[0] += 1
        if conn is not None:
            if open_reads:
                conn.send(mc_get(queue, None, "/close"))
                conn.expect(END, got[0])
            conn.close()

    def producer() -> None:
        conn = Connection(args.host, args.port)
        request = mc_set(queue, data)
        for i in range(count):
            t0 = time.perf_counter_ns()
            conn.send(request)
            conn.expect(STORED, i)
            timed(set_times, t0)
            if args.sleep > 0:
                time.sleep(args.sleep / 1000)
        conn.close()

    _, duration = run_threads([consumer] * args.clients + [producer])
    out(f"Received {got[0]} items in {int(duration)} msec.")
    out(latency_line("set", set_times))
    out(latency_line("get hit", merged(get_times)))
    if got[0] != count:
        raise LoadError(f"Expected {count} items, received {got[0]}!")
    return 0


# -- packing


def packing(args: argparse.Namespace, out: Output) -> int:
    """Keep the queue one batch behind through C{-c} cycles to exercise read-behind and packing."""
    queue, n = args.queue, args.items
    data = "x" * 1024 * args.kilobytes
    out(f"packing: {n} items of {args.kilobytes}kB with {args.pause} second pauses")
    flush_first(args, [queue], out)
    monitor_if_asked(args, queue, out)
    counters = {"read": 0, "write": 0}
    put_times, get_times = Histogram(), Histogram()

    def item(counter: int) -> bytes:
        return (str(counter) + data)[:len(data)].encode()

    def put(start: int) -> None:
        h = Histogram()
        if args.thrift:
            client = ThriftClient(args.host, args.port)
            thrift_put_until(client, queue, n, 1, lambda i: [item(start + i)], h)
            client.close()
        else:
            conn = Connection(args.host, args.port)
            for i in range(n):
                t0 = time.perf_counter_ns()
                conn.send(mc_set(queue, item(start + i)))
                conn.expect(STORED, i)
                timed(h, t0)
            conn.close()
        put_times.merge(h)

    def get(start: int) -> int:
        h = Histogram()
        misses = count = 0
        if args.thrift:
            client = ThriftClient(args.host, args.port)
            while count < n:
                t0 = time.perf_counter_ns()
                items = client.get(queue, 1, 1000, 0)
                timed(h, t0)
                if not items:
                    misses += 1
                elif items[0].data != item(start + count):
                    raise LoadError(f"Unexpected item at {count}: expected "
                                    f"{item(start + count)[:40]!r}, got {items[0].data[:40]!r}!")
                else:
                    count += 1
            client.close()
        else:
            conn = Connection(args.host, args.port)
            misses = get_until(conn, queue, mc_get(queue, 1000), n,
                               lambda i: item(start + i), h)
            conn.close()
        get_times.merge(h)
        return misses

    def cycle(reads: bool, writes: bool) -> None:
        targets: list[Callable[[], Any]] = []
        if writes:
            targets.append(lambda: put(counters["write"]))
        if reads:
            targets.append(lambda: get(counters["read"]))
        results, duration = run_threads(targets)
        if writes:
            out(f"Wrote {n} items starting at {counters['write']}.")
            counters["write"] += n
        if reads:
            counters["read"] += n
            out(f"Read {n} items in {int(duration)} msec. "
                f"Consumer spun {results[-1]} times in misses.")

    cycle(False, True)
    for i in range(args.cycles):
        out(f"cycle: {i + 1}")
        cycle(True, True)
        time.sleep(args.pause)
    cycle(True, False)
    out(latency_line("put", put_times))
    out(latency_line("get", get_times))
    return 0


# -- leaky-reader


def leaky_reader(args: argparse.Namespace, out: Output) -> int:
    """Thrift consumers confirm all but a fraction of reads; every item must end up confirmed."""
    queue, total = args.queue, args.items
    out(f"leaky-reader: {args.threads} threads each sending {total} items through {queue}")
    flush_first(args, [queue], out)
    incomplete = set(range(total))
    lock = threading.Lock()
    num_read = [0]
    put_times = Histogram()
    get_times: list[Histogram] = []

    def now() -> str:
        return datetime.now(UTC).isoformat(timespec="milliseconds")

    def producer() -> None:
        client = ThriftClient(args.host, args.port)
        for n in range(total):
            t0 = time.perf_counter_ns()
            if client.put(queue, [b"%08x" % n], 0) != 1:
                raise LoadError(f"Unexpected response at {n}!")
            timed(put_times, t0)
        client.close()

    def consumer() -> None:
        h = Histogram()
        get_times.append(h)
        rng = random.Random()
        client = ThriftClient(args.host, args.port)
        while num_read[0] < total:
            t0 = time.perf_counter_ns()
            items = client.get(queue, 1, 100, args.auto_abort)
            timed(h, t0)
            if not items:
                continue
            if len(items) > 1:
                raise LoadError(f"Unexpected number of items: {len(items)}!")
            try:
                xid, bit = items[0].id, int(items[0].data, 16)
            except ValueError:
                raise LoadError(f"Unexpected item: {items[0].data[:40]!r}!") from None
            if args.verbose:
                out(f"{now()}: open {xid:016x} = {bit:08x}")
            if rng.random() >= args.drop_rate:
                if args.verbose:
                    out(f"{now()}: confirm {xid:016x}")
                confirmed = client.confirm(queue, {xid})
                if confirmed != 1:
                    raise LoadError(f"Unexpected number of items confirmed: {confirmed} ({xid})!")
                with lock:
                    num_read[0] += 1
                    x = num_read[0]
                    incomplete.discard(bit)
                if x % 1000 == 0:
                    out(str(x))
        client.close()

    _, duration = run_threads([producer] + [consumer] * args.threads)
    out(f"Finished in {int(duration)} msec "
        f"({duration * 1000.0 / (total * args.threads):.1f} usec/put throughput).")
    if incomplete:
        out("Missed the following items:")
        for i in sorted(incomplete):
            out(f"\t{i:08x}")
    else:
        out("Completed all reads")
    out(latency_line("put", put_times))
    out(latency_line("get", merged(get_times)))
    return 1 if incomplete else 0


