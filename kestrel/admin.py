"""
The admin HTTP interface (port 2223): health, stats, Prometheus metrics, and operator commands.

====================  ======  =====================================================
path                  method  what it does
====================  ======  =====================================================
C{/ping}              GET     C{pong}
C{/stats.json}        GET     Ostrich-style stats: counters, gauges, labels, metrics
C{/metrics}           GET     Prometheus text format (C{prometheus_client})
C{/status}            GET     the reported status (C{UP}, C{READONLY}, ...)
C{/status}            POST    set the status: C{status=<name>} (form or query)
C{/quiesce}           POST    set the status to Quiescent
C{/reload}            POST    reread the config file
C{/shutdown}          POST    stop the server
====================  ======  =====================================================

Every C{POST} (the state changes) goes through L{AdminGuard}: with a token
configured (C{admin_token} or C{admin_token_file}) it must carry
C{Authorization: Bearer <token>}; whatever the token, a request whose
C{Origin} is not the admin site itself is refused, and without a token a
form or C{text/plain} body (what a web page can send without asking) or a
C{Host} that is a DNS name (DNS rebinding) is refused too. C{GET} reports
need no token. See C{docs/guide.md}, "Securing the admin port".

Every report is built from the live objects at request time (no background
collection). The server context is L{kestrel.server.KestrelServer}: the
queues are read through its C{collection}, the counters through its
C{stats}, the latency distributions through its C{metrics} (a
L{kestrel.metrics.Metrics} that the sessions and journals record into). See
C{docs/metrics.md}.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from kestrel.errors import ConfigError, KestrelError
from kestrel.metrics import GLOBAL_METRICS

#: Kestrel reported these for "no limit" (Scala's Int.MaxValue and Long.MaxValue).
NO_MAX_ITEMS = 2**31 - 1
NO_MAX_BYTES = 2**63 - 1

#: Per-queue counters of Ostrich's C{q/<name>/...} (Kestrel's names), as queue attributes.
QUEUE_COUNTERS = (
    "total_items", "put_items", "put_bytes", "get_items_hit", "get_items_miss", "transactions",
    "canceled_transactions", "expired_items", "discarded", "total_flushes", "journal_rewrites",
    "journal_rotations",
)

#: Upper bounds (seconds) of the Prometheus latency histograms.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: Prometheus names of the global counters whose Kestrel name reads badly with C{_total}.
_COUNTER_NAMES = {"total_items": "kestrel_items_added",
                  "total_connections": "kestrel_connections_opened"}


def _queue_gauges(queue: Any) -> dict[str, int | float]:
    """The Ostrich gauges of one queue, read from its stats and config."""
    dumped = dict(queue.dump_stats())
    config = getattr(queue, "config", None)
    max_items = getattr(config, "max_items", None)
    max_size = getattr(config, "max_size", None)
    journal = queue.journal
    return {
        "items": queue.length,
        "max_items": NO_MAX_ITEMS if max_items is None else max_items,
        "bytes": queue.bytes,
        "max_bytes": NO_MAX_BYTES if max_size is None else max_size,
        "journal_size": journal.size + journal.archived_size,
        "mem_items": int(dumped.get("mem_items", 0)),
        "mem_bytes": queue.memory_bytes,
        "age_msec": int(dumped.get("age", 0)),
        "waiters": int(dumped.get("waiters", 0)),
        "open_transactions": int(dumped.get("open_transactions", 0)),
        "create_time": int(queue.create_time),
    }


def _queues(collection: Any) -> Iterator[tuple[str, Any]]:
    """Every live queue of C{collection} (aliases excluded) as C{(name, queue)}."""
    for name in collection.queue_names(include_aliases=False):
        queue = collection.queue(name, create=False)
        if queue is not None:
            yield name, queue


def _aliases(collection: Any) -> Iterator[tuple[str, Any]]:
    """Every alias of C{collection} as C{(name, alias)}."""
    for name in collection.alias_names():
        alias = collection.alias(name)
        if alias is not None:
            yield name, alias


def stats_report(server: Any) -> dict[str, dict[str, Any]]:
    """
    Return the Ostrich C{/stats.json} document of C{server}.

    C{{"counters": {...}, "gauges": {...}, "labels": {...}, "metrics": {...}}},
    with the global names and the per-queue C{q/<name>/<stat>} names of
    Kestrel 2.4 (C{docs/metrics.md}); each metric is C{count, minimum, maximum, average,
    p50, p90, p95, p99, p999, p9999}.
    """
    collection = server.collection
    status = server.status
    counters: dict[str, int] = dict(server.stats.counters())
    gauges: dict[str, int | float] = {
        "items": collection.current_items(),
        "bytes": collection.current_bytes(),
        "reserved_memory_ratio": round(collection.reserved_memory_ratio(), 3),
        "connections": server.stats.curr_connections,
        "status/readable": status.readable,
        "status/writeable": status.writeable,
    }
    labels = {"version": server.version, "status": status.status.display_name}
    queue_names = []
    for name, queue in _queues(collection):
        queue_names.append(name)
        for counter in QUEUE_COUNTERS:
            counters[f"q/{name}/{counter}"] = getattr(queue, counter)
        for gauge, value in _queue_gauges(queue).items():
            gauges[f"q/{name}/{gauge}"] = value
    for name, alias in _aliases(collection):
        counters[f"q/{name}/put_items"] = alias.put_items
        counters[f"q/{name}/put_bytes"] = alias.put_bytes
        gauges[f"q/{name}/create_time"] = int(alias.create_time)
    metrics = server.metrics
    report = {name: h.summary() for name, h in metrics.global_items()}
    live = set(queue_names)
    for name in metrics.queue_names():
        if name in live:
            for metric, h in metrics.queue(name).items():
                report[f"q/{name}/{metric}"] = h.summary()
    return {"counters": counters, "gauges": gauges, "labels": labels, "metrics": report}


def _seconds_scale(name: str) -> tuple[str, float] | None:
    """The Prometheus base name and unit scale of a C{*_usec} / C{*_msec} metric."""
    if name.endswith("_usec"):
        return name[:-5], 1e-6
    if name.endswith("_msec"):
        return name[:-5], 1e-3
    return None


class KestrelCollector:
    """
    A C{prometheus_client} collector reading one server's live objects at scrape time.

    Per queue (label C{queue}): items, bytes, open transactions, waiters,
    journal bytes, and the adds, removes (items handed to readers) and
    expirations counters. Server-wide: connections, items, bytes, uptime,
    status, every global counter, and every global latency metric (fsync
    delay included) as a histogram in seconds.
    """

    def __init__(self, server: Any) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        """Yield every metric family, built from the server's current state."""
        server = self.server
        collection = server.collection
        per_queue = {
            "items": GaugeMetricFamily("kestrel_queue_items",
                                       "Items in the queue, open reads excluded", labels=["queue"]),
            "bytes": GaugeMetricFamily("kestrel_queue_bytes", "Payload bytes in the queue",
                                       labels=["queue"]),
            "open": GaugeMetricFamily("kestrel_queue_open_transactions",
                                      "Reads opened and not yet confirmed or aborted",
                                      labels=["queue"]),
            "waiters": GaugeMetricFamily("kestrel_queue_waiters", "Clients blocked in a read",
                                         labels=["queue"]),
            "journal": GaugeMetricFamily("kestrel_queue_journal_bytes",
                                         "Bytes of journal on disk, all files", labels=["queue"]),
            "adds": CounterMetricFamily("kestrel_queue_adds", "Items added by clients",
                                        labels=["queue"]),
            "removes": CounterMetricFamily("kestrel_queue_removes",
                                           "Items handed to readers", labels=["queue"]),
            "expired": CounterMetricFamily("kestrel_queue_expirations", "Items that expired",
                                           labels=["queue"]),
        }
        for name, queue in _queues(collection):
            gauges = _queue_gauges(queue)
            per_queue["items"].add_metric([name], gauges["items"])
            per_queue["bytes"].add_metric([name], gauges["bytes"])
            per_queue["open"].add_metric([name], gauges["open_transactions"])
            per_queue["waiters"].add_metric([name], gauges["waiters"])
            per_queue["journal"].add_metric([name], gauges["journal_size"])
            per_queue["adds"].add_metric([name], queue.put_items)
            per_queue["removes"].add_metric([name], queue.get_items_hit)
            per_queue["expired"].add_metric([name], queue.expired_items)
        yield from per_queue.values()

        stats = server.stats
        yield GaugeMetricFamily("kestrel_connections", "Open client connections",
                                value=stats.curr_connections)
        yield GaugeMetricFamily("kestrel_items", "Items in every queue",
                                value=collection.current_items())
        yield GaugeMetricFamily("kestrel_bytes", "Payload bytes in every queue",
                                value=collection.current_bytes())
        yield GaugeMetricFamily("kestrel_uptime_seconds", "Seconds since the server started",
                                value=stats.uptime(server.clock.seconds()))
        status = GaugeMetricFamily("kestrel_status", "1 for the reported server status",
                                   labels=["status"])
        status.add_metric([server.status.status.display_name], 1)
        yield status
        info = GaugeMetricFamily("kestrel_build_info", "The server version", labels=["version"])
        info.add_metric([server.version], 1)
        yield info
        for counter, value in stats.counters().items():
            if counter == "curr_connections":
                continue
            name = _COUNTER_NAMES.get(counter, f"kestrel_{counter}")
            yield CounterMetricFamily(name, f"Kestrel's {counter} counter", value=value)
        metrics = server.metrics
        for name in GLOBAL_METRICS:
            scaled = _seconds_scale(name)
            if scaled is None:
                continue
            base, scale = scaled
            h = getattr(metrics, name)
            bounds = tuple(int(b / scale) for b in LATENCY_BUCKETS)
            cumulative = h.cumulative(bounds)
            buckets = [(repr(le), float(n)) for le, n in zip(LATENCY_BUCKETS, cumulative,
                                                            strict=True)]
            buckets.append(("+Inf", float(h.count)))
            yield HistogramMetricFamily(f"kestrel_{base}_seconds",
                                        f"Kestrel's {name}, in seconds",
                                        buckets=buckets, sum_value=h.total * scale)


def prometheus_text(server: Any) -> bytes:
    """Return the Prometheus text exposition of C{server}'s metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(KestrelCollector(server))
    return generate_latest(registry)


#: Content types a web page may POST cross-site without a preflight (the CORS "simple" ones).
SIMPLE_CONTENT_TYPES = frozenset({b"application/x-www-form-urlencoded", b"multipart/form-data",
                                  b"text/plain"})

#: Shortest admin token accepted.
MIN_TOKEN_LENGTH = 16


def load_admin_token(config: Any) -> str | None:
    """
    The admin token of C{config}: C{admin_token}, or the first line of
    C{admin_token_file} (surrounding blanks dropped), or None for none.

    @raise ConfigError: the file cannot be read, or holds a token shorter
        than L{MIN_TOKEN_LENGTH} characters.
    """
    if config.admin_token is not None:
        return str(config.admin_token).strip()
    path = config.admin_token_file
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            token = f.readline().strip()
        mode = os.stat(path).st_mode
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"admin_token_file: cannot read {path!r}: {e}"]) from e
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError([f"admin_token_file: {path!r} must hold a token of at least "
                           f"{MIN_TOKEN_LENGTH} characters"])
    if mode & 0o077:
        Logger().warn("admin_token_file {path} is readable by other users (mode {mode:o}); "
                      "chmod 600 it", path=path, mode=mode & 0o777)
    return token


def _host_name(host: str) -> str:
    """The host part of a C{Host} header or URL netloc (no port, no IPv6 brackets), lowercased."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_ip_or_localhost(host: str) -> bool:
    name = _host_name(host)
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class AdminGuard:
    """
    Decides whether a state-changing admin request may run.

    C{token} is the configured bearer token, or None. L{refusal} returns
    C{(code, reason)} for a request to refuse, None for one to serve.
    """

    _log = Logger()

    def __init__(self, token: str | None) -> None:
        self.token = token

    def refusal(self, request: Request) -> tuple[int, str] | None:
        """Why C{request} (a POST) must be refused, or None when it may run."""
        headers = request.requestHeaders
        host = (headers.getRawHeaders(b"host") or [b""])[0].decode("latin-1")
        origin = (headers.getRawHeaders(b"origin") or [None])[0]
        if origin is not None:
            netloc = urlsplit(origin.decode("latin-1")).netloc.lower()
            if not netloc or netloc != host.strip().lower():
                return 403, "cross-origin request refused"
        fetch_site = (headers.getRawHeaders(b"sec-fetch-site") or [b""])[0].lower()
        if fetch_site in (b"cross-site", b"same-site"):
            return 403, "cross-site request refused"
        if self.token is not None:
            given = (headers.getRawHeaders(b"authorization") or [b""])[0]
            scheme, _, value = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(
                    value.strip(), self.token.encode("utf-8")):
                request.setHeader(b"www-authenticate", b'Bearer realm="kestrel admin"')
                return 401, "admin token required: Authorization: Bearer <admin_token>"
            return None
        content_type = (headers.getRawHeaders(b"content-type") or [b""])[0]
        if content_type.split(b";", 1)[0].strip().lower() in SIMPLE_CONTENT_TYPES:
            return 403, ("form and text/plain bodies are refused without an admin token: "
                         "pass arguments in the query string (POST /status?status=readonly)")
        if host and not _is_ip_or_localhost(host):
            return 403, ("without an admin token, commands must address the server by IP "
                         "address or localhost")
        return None


class _Leaf(Resource):
    """
    A resource serving one path of the admin site for one server; anything
    but C{GET}/C{HEAD} must first pass the site's L{AdminGuard}.
    """

    _log = Logger()

    def __init__(self, server: Any, guard: AdminGuard | None = None) -> None:
        super().__init__()
        # Not "server": twisted.web's Resource.putChild overwrites that attribute.
        self.kestrel = server
        self.guard = guard if guard is not None else AdminGuard(None)

    def render(self, request: Request) -> bytes:
        """Refuse a state change the guard refuses (401/403), else serve it."""
        if request.method not in (b"GET", b"HEAD"):
            refused = self.guard.refusal(request)
            if refused is not None:
                code, reason = refused
                peer = request.getClientAddress()
                self._log.warn("admin {method} {path} from {peer} refused: {reason}",
                               method=request.method.decode("latin-1"),
                               path=request.path.decode("latin-1"),
                               peer=getattr(peer, "host", str(peer)), reason=reason)
                return _text(request, reason, code)
        return super().render(request)


def _text(request: Request, body: str, code: int = 200) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"text/plain; charset=utf-8")
    return (body + "\n").encode("utf-8")


def _method_not_allowed(request: Request, allowed: bytes) -> bytes:
    request.setHeader(b"allow", allowed)
    return _text(request, "method not allowed", 405)


class _Command(_Leaf):
    """A resource that runs a command on C{POST}; C{GET} is refused with 405."""

    def render_GET(self, request: Request) -> bytes:
        """Refuse: commands are POST only."""
        return _method_not_allowed(request, b"POST")


class PingResource(_Leaf):
    """C{GET /ping}: answers C{pong}."""

    def render_GET(self, request: Request) -> bytes:
        """Answer C{pong}."""
        return _text(request, "pong")


class StatsJsonResource(_Leaf):
    """C{GET /stats.json}: the Ostrich-style stats document."""

    def render_GET(self, request: Request) -> bytes:
        """Return L{stats_report} as JSON."""
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(stats_report(self.kestrel), sort_keys=True).encode("utf-8")


class MetricsResource(_Leaf):
    """C{GET /metrics}: the Prometheus text exposition."""

    def render_GET(self, request: Request) -> bytes:
        """Return L{prometheus_text}."""
        request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode())
        return prometheus_text(self.kestrel)


class StatusResource(_Leaf):
    """C{GET /status} reports the status; C{POST /status} with C{status=<name>} sets it."""

    _log = Logger()

    def render_GET(self, request: Request) -> bytes:
        """Return the reported status (C{UP}, C{READONLY}, ...)."""
        return _text(request, self.kestrel.status.status.wire_name)

    def render_POST(self, request: Request) -> bytes:
        """Set the status named by the C{status} argument; 400 with the reason if refused."""
        values = request.args.get(b"status") or []
        if not values:
            body = request.content.read().strip() if request.content is not None else b""
            values = [body] if body else []
        if not values:
            return _text(request, "missing status: use status=up|readonly|quiescent|writeavoid",
                         400)
        name = values[0].decode("utf-8", "replace")
        try:
            new = self.kestrel.status.set_status(name)
        except KestrelError as e:
            return _text(request, str(e), 400)
        self._log.info("status set to {status} over admin HTTP", status=new.display_name)
        return _text(request, new.wire_name)


class QuiesceResource(_Command):
    """C{POST /quiesce}: set the status to Quiescent (reads and writes refused)."""

    def render_POST(self, request: Request) -> bytes:
        """Set Quiescent; 400 with the reason if refused."""
        try:
            new = self.kestrel.status.set_status("quiescent")
        except KestrelError as e:
            return _text(request, str(e), 400)
        return _text(request, new.wire_name)


class ReloadResource(_Command):
    """C{POST /reload}: reread the config file; 400 naming the problems if it is broken."""

    def render_POST(self, request: Request) -> bytes:
        """Reload; the config in force is kept when the new one is broken."""
        try:
            self.kestrel.reload()
        except ConfigError as e:
            return _text(request, f"Reload failed; config kept: {e}", 400)
        return _text(request, "Reloaded config.")


class ShutdownResource(_Command):
    """C{POST /shutdown}: stop the server cleanly (after this reply is sent)."""

    def render_POST(self, request: Request) -> bytes:
        """Ask the server to shut down."""
        self.kestrel.request_shutdown()
        return _text(request, "Shutting down.")


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


class AdminSite(Site):
    """The admin HTTP site; requests are not access-logged (scrapes would flood the log)."""

    def log(self, request: Request) -> None:
        """Log nothing per request."""


def make_admin_site(server: Any) -> Site:
    """
    Return the admin HTTP site of C{server} (a L{kestrel.server.KestrelServer}).

    Its token is read now (L{load_admin_token}; a C{ConfigError} stops the
    start). Without one, on an address other than loopback, a warning says
    that anyone who can reach the port can change the server's state.
    """
    config = server.config
    token = load_admin_token(config)
    guard = AdminGuard(token)
    address = getattr(config, "admin_address", "127.0.0.1")
    if token is None and not _is_loopback(address):
        Logger().warn("The admin port listens on {address} without admin_token: anyone who "
                      "can reach it can change the status, reload or stop the server",
                      address=address)
    root = Resource()
    for path, resource in [
        (b"ping", PingResource), (b"stats.json", StatsJsonResource),
        (b"metrics", MetricsResource), (b"status", StatusResource),
        (b"quiesce", QuiesceResource), (b"reload", ReloadResource),
        (b"shutdown", ShutdownResource),
    ]:
        root.putChild(path, resource(server, guard))
    site = AdminSite(root)
    site.displayTracebacks = False
    return site
