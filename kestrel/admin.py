"""
The admin HTTP interface (port 2223): health, stats, Prometheus metrics, and operator commands.

====================  ======  =====================================================
path                  method  what it does
====================  ======  =====================================================
C{/ping}              GET     C{pong}
C{/ready}             GET     200 C{ready} once every queue is loaded; 503 while
                              journals still replay at startup (names the queues)
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

Every report is built at request time (no background collection) from the
typed records L{kestrel.server.KestrelServer} returns: C{server_report()}
(counters, totals, status), C{queue_reports()} and C{alias_reports()}, and
C{latency_summaries()} / C{latency_histograms()}. This module reads no queue,
journal or collection itself. See C{docs/metrics.md}.
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
from twisted.web import http
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from kestrel.errors import ConfigError, KestrelError
from kestrel.server import KestrelServer
from kestrel.stats import QueueReport

#: Kestrel reported these for "no limit" (Scala's Int.MaxValue and Long.MaxValue).
NO_MAX_ITEMS = 2**31 - 1
NO_MAX_BYTES = 2**63 - 1

#: Upper bounds (seconds) of the Prometheus latency histograms.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: Prometheus names of the global counters whose Kestrel name reads badly with C{_total}.
_COUNTER_NAMES = {"total_items": "kestrel_items_added",
                  "total_connections": "kestrel_connections_opened"}


def _queue_gauges(queue: QueueReport) -> dict[str, int | float]:
    """The Ostrich gauges of one queue report (Kestrel's names and "no limit" values)."""
    return {
        "items": queue.items,
        "max_items": NO_MAX_ITEMS if queue.max_items is None else queue.max_items,
        "bytes": queue.bytes,
        "max_bytes": NO_MAX_BYTES if queue.max_bytes is None else queue.max_bytes,
        "journal_size": queue.journal_bytes,
        "mem_items": queue.mem_items,
        "mem_bytes": queue.mem_bytes,
        "age_msec": queue.age_ms,
        "waiters": queue.waiters,
        "open_transactions": queue.open_transactions,
        "create_time": int(queue.create_time),
    }


def stats_report(server: KestrelServer) -> dict[str, dict[str, Any]]:
    """
    Return the Ostrich C{/stats.json} document of C{server}.

    C{{"counters": {...}, "gauges": {...}, "labels": {...}, "metrics": {...}}},
    with the global names and the per-queue C{q/<name>/<stat>} names of
    Kestrel 2.4 (C{docs/metrics.md}); each metric is C{count, minimum, maximum, average,
    p50, p90, p95, p99, p999, p9999}.
    """
    state = server.server_report()
    counters: dict[str, int] = dict(state.counters)
    gauges: dict[str, int | float] = {
        "items": state.items,
        "bytes": state.bytes,
        "reserved_memory_ratio": round(state.reserved_memory_ratio, 3),
        "connections": state.connections,
        "status/readable": state.readable,
        "status/writeable": state.writeable,
        "queues_loading": state.queues_loading,
    }
    labels = {"version": state.version, "status": state.status}
    for queue in server.queue_reports():
        name = queue.name
        for counter, value in queue.counters.items():
            counters[f"q/{name}/{counter}"] = value
        for gauge, reading in _queue_gauges(queue).items():
            gauges[f"q/{name}/{gauge}"] = reading
    for alias in server.alias_reports():
        counters[f"q/{alias.name}/put_items"] = alias.put_items
        counters[f"q/{alias.name}/put_bytes"] = alias.put_bytes
        gauges[f"q/{alias.name}/create_time"] = int(alias.create_time)
    report = {name: dict(summary) for name, summary in server.latency_summaries().items()}
    return {"counters": counters, "gauges": gauges, "labels": labels, "metrics": report}


class KestrelCollector:
    """
    A C{prometheus_client} collector reading one server's live objects at scrape time.

    Per queue (label C{queue}): items, bytes, open reads, waiters,
    journal bytes, and the adds, removes (items handed to readers) and
    expirations counters. Server-wide: connections, items, bytes, uptime,
    status, every global counter, and every global latency metric (fsync
    delay included) as a histogram in seconds.
    """

    def __init__(self, server: KestrelServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        """Yield every metric family, built from the server's current state."""
        server = self.server
        per_queue: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
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
        for queue in server.queue_reports():
            label = [queue.name]
            per_queue["items"].add_metric(label, queue.items)
            per_queue["bytes"].add_metric(label, queue.bytes)
            per_queue["open"].add_metric(label, queue.open_transactions)
            per_queue["waiters"].add_metric(label, queue.waiters)
            per_queue["journal"].add_metric(label, queue.journal_bytes)
            per_queue["adds"].add_metric(label, queue.counters["put_items"])
            per_queue["removes"].add_metric(label, queue.counters["get_items_hit"])
            per_queue["expired"].add_metric(label, queue.counters["expired_items"])
        yield from per_queue.values()

        state = server.server_report()
        yield GaugeMetricFamily("kestrel_connections", "Open client connections",
                                value=state.connections)
        yield GaugeMetricFamily("kestrel_items", "Items in every queue", value=state.items)
        yield GaugeMetricFamily("kestrel_bytes", "Payload bytes in every queue",
                                value=state.bytes)
        yield GaugeMetricFamily("kestrel_uptime_seconds", "Seconds since the server started",
                                value=state.uptime)
        yield GaugeMetricFamily("kestrel_queues_loading",
                                "Queues still replaying their journal at startup",
                                value=state.queues_loading)
        status = GaugeMetricFamily("kestrel_status", "1 for the reported server status",
                                   labels=["status"])
        status.add_metric([state.status], 1)
        yield status
        info = GaugeMetricFamily("kestrel_build_info", "The server version", labels=["version"])
        info.add_metric([state.version], 1)
        yield info
        for counter, value in state.counters.items():
            if counter == "curr_connections":
                continue
            name = _COUNTER_NAMES.get(counter, f"kestrel_{counter}")
            yield CounterMetricFamily(name, f"Kestrel's {counter} counter", value=value)
        for h in server.latency_histograms(LATENCY_BUCKETS):
            base = h.name[:-5]  # without _usec / _msec
            buckets = [(repr(le), float(n)) for le, n in zip(h.bounds, h.cumulative,
                                                            strict=True)]
            buckets.append(("+Inf", float(h.count)))
            yield HistogramMetricFamily(f"kestrel_{base}_seconds",
                                        f"Kestrel's {h.name}, in seconds",
                                        buckets=buckets, sum_value=h.sum_seconds)


def prometheus_text(server: KestrelServer) -> bytes:
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
        origins = headers.getRawHeaders(b"origin")
        origin = origins[0] if origins else None
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


class ReadyResource(_Leaf):
    """
    C{GET /ready}: the readiness probe. C{200 ready} once every queue found
    at startup is loaded; C{503} while journals still replay (the server
    already serves the queues that are loaded), naming the queues still loading.
    """

    def render_GET(self, request: Request) -> bytes:
        """Answer C{ready}, or 503 with the queues still loading."""
        loading = self.kestrel.loading_queue_names()
        if not loading:
            return _text(request, "ready")
        return _text(request, f"loading {len(loading)} queue(s): {' '.join(loading)}", 503)


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
        return _text(request, self.kestrel.reported_status().wire_name)

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
            new = self.kestrel.set_status(name)
        except KestrelError as e:
            return _text(request, str(e), 400)
        self._log.info("status set to {status} over admin HTTP", status=new.display_name)
        return _text(request, new.wire_name)


class QuiesceResource(_Command):
    """C{POST /quiesce}: set the status to Quiescent (reads and writes refused)."""

    def render_POST(self, request: Request) -> bytes:
        """Set Quiescent; 400 with the reason if refused."""
        try:
            new = self.kestrel.set_status("quiescent")
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

    def log(self, request: http.Request) -> None:
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
        (b"ping", PingResource), (b"ready", ReadyResource),
        (b"stats.json", StatsJsonResource),
        (b"metrics", MetricsResource), (b"status", StatusResource),
        (b"quiesce", QuiesceResource), (b"reload", ReloadResource),
        (b"shutdown", ShutdownResource),
    ]:
        root.putChild(path, resource(server, guard))
    site = AdminSite(root)
    site.displayTracebacks = False
    return site
