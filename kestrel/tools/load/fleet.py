"""
C{kestrel-load fleet}: producers and reliable consumers moving items through a
fleet of servers with the fleet client (L{kestrel.client.KestrelClient}).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from kestrel.metrics import Histogram
from kestrel.tools.load.clients import (
    LoadError,
    Output,
    latency_line,
    timed,
)

# -- fleet


def fleet(args: argparse.Namespace, out: Output) -> int:
    """
    Producers and reliable consumers move C{-n} items through a fleet with the fleet client.

    The servers come from C{--servers} or from ZooKeeper server sets
    (C{--zookeeper}). The client runs on the reactor in a background thread;
    every item is put, read with C{/open} and confirmed.
    """
    from twisted.internet.defer import Deferred
    from twisted.internet.threads import blockingCallFromThread

    from kestrel.client.blocking import running_reactor

    reactor = running_reactor()
    # mypy cannot choose _R between the arms of blockingCallFromThread's union.
    return blockingCallFromThread(reactor, lambda: Deferred.fromCoroutine(  # type: ignore[arg-type]
        _fleet_run(reactor, args, out)))


async def _fleet_run(reactor: Any, args: argparse.Namespace, out: Output) -> int:
    from collections import Counter

    from twisted.internet.defer import Deferred, DeferredList
    from twisted.internet.task import deferLater
    from twisted.python.failure import Failure

    from kestrel.client import ClientError, KestrelClient, ZooKeeperServers
    from kestrel.client.discovery import parse_servers, parse_zookeeper

    protocol = "thrift" if args.thrift else "memcache"
    if args.zookeeper:
        hosts, prefix = parse_zookeeper(args.zookeeper)
        client = KestrelClient(ZooKeeperServers(hosts, prefix, reactor, endpoint=protocol),
                               reactor=reactor, protocol=protocol)
    else:
        client = KestrelClient(parse_servers(args.servers), reactor=reactor, protocol=protocol)
    try:
        await client.ready()
    except ClientError as e:
        await client.close()
        raise LoadError(str(e)) from e
    queue, n, rollup = args.queue, args.items, args.rollup
    data = b"x" * args.bytes
    out(f"fleet: write set {','.join(client.servers.write)}; "
        f"read set {','.join(client.servers.read)}")
    out(f"fleet: protocol={protocol} producers={args.producers} consumers={args.consumers} "
        f"putting {n} items "
        f"of {args.bytes} bytes (in chunks of {rollup}) to {queue}")
    put_h, read_h, confirm_h = Histogram(), Histogram(), Histogram()
    put_on: Counter[str] = Counter()
    read_on: Counter[str] = Counter()
    state = {"put": 0, "read": 0, "misses": 0, "errors": 0}
    deadline = time.monotonic() + args.timeout

    def failed(what: str, error: ClientError) -> None:
        state["errors"] += 1
        out(f"fleet: {what} failed: {error}")

    async def produce(count: int) -> None:
        done = 0
        while done < count and time.monotonic() < deadline:
            batch = [data] * min(rollup, count - done)
            t0 = time.perf_counter_ns()
            try:
                servers = await client.put(queue, batch)
            except ClientError as e:
                failed("put", e)
                await deferLater(reactor, 0.5, lambda: None)
                continue
            timed(put_h, t0)
            put_on.update(servers)
            done += len(batch)
            state["put"] += len(batch)

    async def consume() -> None:
        while state["read"] < n and time.monotonic() < deadline:
            t0 = time.perf_counter_ns()
            try:
                handle = await client.read(queue, 1.0)
            except ClientError as e:
                failed("read", e)
                await deferLater(reactor, 0.5, lambda: None)
                continue
            timed(read_h, t0)
            if handle is None:
                state["misses"] += 1
                continue
            if handle.data != data:
                await handle.abort()
                raise LoadError(f"Unexpected response at {state['read']}!")
            t0 = time.perf_counter_ns()
            try:
                await handle.confirm()
            except ClientError as e:
                failed("confirm", e)
                continue
            timed(confirm_h, t0)
            read_on[handle.server] += 1
            state["read"] += 1

    def progress() -> None:
        out(f"fleet: {state['put']} put, {state['read']} read and confirmed")

    from twisted.internet.task import LoopingCall

    ticker = LoopingCall(progress)
    ticker.clock = reactor
    ticker.start(args.progress, now=False)
    per_producer = [n // args.producers + (1 if i < n % args.producers else 0)
                    for i in range(args.producers)]
    started = time.perf_counter()
    workers = [Deferred.fromCoroutine(produce(c)) for c in per_producer]
    workers += [Deferred.fromCoroutine(consume()) for _ in range(args.consumers)]
    results = await DeferredList(workers, consumeErrors=True)
    duration = (time.perf_counter() - started) * 1000.0
    ticker.stop()
    await client.close()
    for _, value in results:
        if isinstance(value, Failure):
            raise LoadError(value.getErrorMessage())
    out(f"Finished in {int(duration)} msec "
        f"({duration * 1000.0 / max(1, state['read']):.1f} usec/item throughput).")
    out("puts per server: " + " ".join(f"{s}={c}" for s, c in sorted(put_on.items())))
    out("reads per server: " + " ".join(f"{s}={c}" for s, c in sorted(read_on.items())))
    out(f"Consumer(s) spun {state['misses']} times in misses; {state['errors']} errors.")
    out(latency_line("put", put_h))
    out(latency_line("read", read_h))
    out(latency_line("confirm", confirm_h))
    if state["read"] < n:
        out(f"fleet: only {state['read']} of {n} items read within {args.timeout:g}s")
        return 1
    return 0


