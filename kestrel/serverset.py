"""
ZooKeeper server sets: advertise this server to clients, as Kestrel 2.4 did.

The server joins two Twitter ServerSets, C{<path_prefix>/read} and
C{<path_prefix>/write}, as ephemeral sequential C{member_} znodes holding the
ServerSet JSON (C{serviceEndpoint}, C{additionalEndpoints}, C{status}). The
status of each membership follows the server status (as in Kestrel 2.4):

============  ========  =========
status        read set  write set
============  ========  =========
Up            ALIVE     ALIVE
WriteAvoid    ALIVE     DEAD
ReadOnly      ALIVE     DEAD
Quiescent     DEAD      DEAD
Down          DEAD      DEAD
============  ========  =========

Threading: kazoo is blocking and runs its own threads. Every ZooKeeper
operation runs on one dedicated worker thread, in the order it was asked for,
and reports back to the reactor through Deferreds; kazoo's connection-state
callbacks hop to the reactor with C{callFromThread}. Nothing here blocks the
reactor thread. See C{docs/zookeeper.md}.
"""

from __future__ import annotations

import enum
import fcntl
import ipaddress
import json
import logging
import socket
import struct
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger, LogLevel
from twisted.python.threadpool import ThreadPool

from kestrel.errors import KestrelError
from kestrel.status import ServerStatus, Status


class Membership(enum.Enum):
    """The ServerSet status of one membership."""

    ALIVE = "ALIVE"
    DEAD = "DEAD"


#: The two sets, in the order Kestrel joins them.
READ, WRITE = "read", "write"

#: Endpoint names in order of preference for the main (service) endpoint.
ENDPOINT_PREFERENCE = ("memcache", "thrift", "text")


def read_membership(status: Status) -> Membership:
    """The read-set status for server status C{status}: DEAD once reads are blocked."""
    return Membership.DEAD if status.blocks_reads else Membership.ALIVE


def write_membership(status: Status) -> Membership:
    """The write-set status for server status C{status}: ALIVE only when Up."""
    return Membership.ALIVE if status is Status.UP else Membership.DEAD


_MEMBERSHIP_OF = {READ: read_membership, WRITE: write_membership}


class AdvertiseError(KestrelError):
    """An endpoint address that may not be advertised (loopback), or no usable interface."""


@attrs.frozen
class InterfaceAddress:
    """One IPv4 address of a network interface, with the flags that matter for advertising."""

    name: str
    address: str
    loopback: bool
    point_to_point: bool


_SIOCGIFFLAGS = 0x8913
_SIOCGIFADDR = 0x8915
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
_IFF_POINTOPOINT = 0x10


def interface_addresses() -> list[InterfaceAddress]:
    """
    List the IPv4 address of every interface that is up, in interface-index order.

    Linux only (it asks the kernel with C{SIOCGIFADDR}); elsewhere it returns [].
    """
    found: list[InterfaceAddress] = []
    try:
        names = socket.if_nameindex()
    except OSError:
        return found
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _index, name in names:
            request = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack_from("H", fcntl.ioctl(s, _SIOCGIFFLAGS, request), 16)[0]
                packed = fcntl.ioctl(s, _SIOCGIFADDR, request)[20:24]
            except OSError:
                continue
            if not flags & _IFF_UP:
                continue
            found.append(InterfaceAddress(name, socket.inet_ntoa(packed),
                                          bool(flags & _IFF_LOOPBACK),
                                          bool(flags & _IFF_POINTOPOINT)))
    return found


def external_address(host: str,
                     interfaces: Callable[[], list[InterfaceAddress]] = interface_addresses) -> str:
    """
    Return the address to advertise for a listener bound to C{host}.

    A loopback address is refused (L{AdvertiseError}); a wildcard address
    (C{0.0.0.0}, C{::} or empty) is replaced by the first interface address
    that is not loopback and not link-local (unless the interface is
    point-to-point); any other address is returned as it is. A host name is
    resolved first.
    """
    if host in ("", "*"):
        host = "0.0.0.0"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:
            ip = ipaddress.ip_address(socket.getaddrinfo(host, None)[0][4][0])
        except (OSError, IndexError) as e:
            raise AdvertiseError(f"cannot resolve {host!r}: {e}") from e
    if ip.is_loopback:
        raise AdvertiseError("cannot advertise loopback host via zookeeper")
    if not ip.is_unspecified:
        return str(ip)
    for candidate in interfaces():
        address = ipaddress.ip_address(candidate.address)
        if candidate.loopback or address.is_loopback:
            continue
        if address.is_link_local and not candidate.point_to_point:
            continue
        return candidate.address
    raise AdvertiseError("no acceptable network interfaces found")


def member_data(main: tuple[str, int], endpoints: Mapping[str, tuple[str, int]],
                membership: Membership) -> bytes:
    """Return the Twitter ServerSet JSON of one member (compact, UTF-8)."""
    def endpoint(address: tuple[str, int]) -> dict[str, Any]:
        return {"host": address[0], "port": address[1]}

    document = {
        "serviceEndpoint": endpoint(main),
        "additionalEndpoints": {name: endpoint(a) for name, a in endpoints.items()},
        "status": membership.value,
    }
    return json.dumps(document, separators=(",", ":")).encode("utf-8")


class _KazooLogBridge(logging.Handler):
    """Hands kazoo's (stdlib) log records to the Twisted logger, on the reactor thread."""

    def __init__(self, reactor: IReactorFromThreads, log: Logger) -> None:
        super().__init__(logging.WARNING)
        self._reactor = reactor
        self._log = log

    def emit(self, record: logging.LogRecord) -> None:
        """Forward one record (warnings and errors only)."""
        level = LogLevel.error if record.levelno >= logging.ERROR else LogLevel.warn
        self._reactor.callFromThread(self._log.emit, level, "kazoo: {message}",
                                     message=record.getMessage())


@attrs.define
class _Member:
    """A membership as the worker thread last wrote it."""

    path: str | None = None
    membership: Membership | None = None


def reconnect_delay(session_timeout: float) -> float:
    """
    The longest pause, in seconds, between two attempts to reach ZooKeeper.

    A quarter of the session timeout (at most 2 s; kazoo adds up to 40 %
    jitter): once ZooKeeper is back after a short outage, the publisher
    reaches it well before its session can expire there, so it keeps the
    session and its member znodes.
    """
    return min(2.0, session_timeout / 4)


class ServerSetPublisher(Service):
    """
    Keeps this server's read and write memberships in ZooKeeper in line with its status.

    C{startService} connects and joins both sets (read first); status changes
    update them in Kestrel's order (stricter: write then read; looser: read
    then write; only the sets whose ALIVE/DEAD value changes; DEAD to ALIVE
    joins anew and drops the dead member); C{stopService} marks both DEAD
    (write first), leaves, and closes the client. After a lost session (a
    ZooKeeper restart, an expiry) the members are created again as soon as a
    new session is up.

    @param endpoints: the listeners to advertise by name (C{memcache},
        C{thrift}, C{text}) as C{(host, port)}, or a callable returning them
        when the service starts (for ports bound at start-up). Hosts are
        checked by L{external_address}, unless C{advertise_host} is given: it
        is then advertised as it is (loopback included) for every endpoint.
    @param client_factory: builds the kazoo client (tests may pass options).
    """

    _log = Logger()

    def __init__(self, hosts: str, path_prefix: str, status: ServerStatus,
                 endpoints: Mapping[str, tuple[str, int]]
                 | Callable[[], Mapping[str, tuple[str, int]]],
                 reactor: IReactorFromThreads, *, session_timeout: float = 10.0,
                 interfaces: Callable[[], list[InterfaceAddress]] = interface_addresses,
                 client_factory: Callable[..., Any] | None = None,
                 advertise_host: str | None = None) -> None:
        self.hosts = hosts
        self.advertise_host = advertise_host
        self.path_prefix = path_prefix.rstrip("/")
        self.status = status
        self._endpoints_source = endpoints
        self._reactor = reactor
        self.session_timeout = session_timeout
        self._interfaces = interfaces
        self._client_factory = client_factory
        self._pool: ThreadPool | None = None
        self._client: Any = None
        self._members = {READ: _Member(), WRITE: _Member()}
        self._desired: dict[str, Membership | None] = {READ: None, WRITE: None}
        self._pending: list[Deferred[None]] = []
        self._session_lost = False
        self._stopping = False
        self.main_endpoint: tuple[str, int] | None = None
        self.endpoints: dict[str, tuple[str, int]] = {}
        if not callable(endpoints):
            self._resolve_endpoints(endpoints)

    @classmethod
    def from_config(cls, zookeeper: Any, status: ServerStatus,
                    endpoints: Mapping[str, tuple[str, int]]
                    | Callable[[], Mapping[str, tuple[str, int]]],
                    reactor: IReactorFromThreads) -> ServerSetPublisher:
        """
        Build a publisher from the C{zookeeper:} config section.

        C{zookeeper} has C{host}, C{port}, C{path_prefix}, C{session_timeout}
        (seconds) and optional C{advertise_host} attributes or keys.
        """
        def get(name: str, default: Any = None) -> Any:
            if isinstance(zookeeper, Mapping):
                return zookeeper.get(name, default)
            return getattr(zookeeper, name, default)

        return cls(f"{get('host')}:{get('port', 2181)}", get("path_prefix", "/kestrel"), status,
                   endpoints, reactor, session_timeout=float(get("session_timeout", 10.0)),
                   advertise_host=get("advertise_host"))

    # -- endpoints

    def _resolve_endpoints(self, endpoints: Mapping[str, tuple[str, int]]) -> None:
        if self.endpoints:
            raise KestrelError("endpoints are already configured")
        if not endpoints:
            raise AdvertiseError("no endpoint to advertise")
        # An explicit advertise_host is used as given, loopback included (a
        # fleet on one machine); only the derived address refuses loopback.
        resolved = {name: (self.advertise_host or external_address(host, self._interfaces),
                           int(port))
                    for name, (host, port) in endpoints.items()}
        main = next((n for n in ENDPOINT_PREFERENCE if n in resolved), next(iter(resolved)))
        self.endpoints = resolved
        self.main_endpoint = resolved[main]

    # -- service

    def startService(self) -> None:
        """Resolve endpoints, start the worker thread and the client, and join both sets."""
        if callable(self._endpoints_source):
            self.endpoints = {}  # read again: the ports may differ after a restart
            self._resolve_endpoints(self._endpoints_source())
        super().startService()
        self._stopping = False
        self._pool = ThreadPool(minthreads=1, maxthreads=1, name="kestrel-zookeeper")
        self._pool.start()
        self.status.add_listener(self._status_changed)
        current = self.status.status
        self._desired = {READ: read_membership(current), WRITE: write_membership(current)}
        self._run(self._connect)
        self._log.info("joining ZooKeeper server sets under {prefix} at {hosts} as {endpoint}",
                       prefix=self.path_prefix, hosts=self.hosts,
                       endpoint=f"{self.main_endpoint[0]}:{self.main_endpoint[1]}"
                       if self.main_endpoint else None)
        self._sync(READ)
        self._sync(WRITE)

    def stopService(self) -> Deferred[None]:
        """Mark both memberships DEAD (write first), leave both sets, close the client."""
        super().stopService()
        self._stopping = True
        try:
            self.status.remove_listener(self._status_changed)
        except ValueError:
            pass
        for kind in (WRITE, READ):
            self._desired[kind] = Membership.DEAD
            self._sync(kind)
        for kind in (WRITE, READ):
            self._desired[kind] = None
            self._sync(kind)
        self._run(self._close)
        done = self.flush()

        def stop_pool(result: object) -> object:
            pool, self._pool = self._pool, None
            if pool is not None:
                pool.stop()
            self._log.info("left ZooKeeper server sets")
            return result

        return done.addBoth(stop_pool)

    def flush(self) -> Deferred[None]:
        """Return a Deferred that fires once every ZooKeeper operation asked for so far is done."""
        pending = [d for d in self._pending if not d.called]
        return DeferredList(pending, consumeErrors=True).addCallback(lambda _: None)

    # -- reactor-thread side

    def _run(self, job: Callable[..., None], *args: Any) -> Deferred[None]:
        """Queue C{job(*args)} on the worker thread; failures are logged, never raised."""
        assert self._pool is not None
        d: Deferred[None] = deferToThreadPool(self._reactor, self._pool, job, *args)
        self._pending = [p for p in self._pending if not p.called]
        self._pending.append(d)
        d.addErrback(lambda f: self._log.failure("ZooKeeper operation {job} failed", f,
                                                 job=job.__name__))
        return d

    def _sync(self, kind: str) -> None:
        self._run(self._reconcile, kind, self._desired[kind], False)

    def _status_changed(self, old: Status, new: Status) -> None:
        """The status listener: queue the membership updates in Kestrel's order."""
        if self._stopping or self._pool is None:
            return
        order = (WRITE, READ) if new.stricter_than(old) else (READ, WRITE)
        for kind in order:
            before, after = _MEMBERSHIP_OF[kind](old), _MEMBERSHIP_OF[kind](new)
            if before != after:
                self._desired[kind] = after
                self._sync(kind)

    def _state_changed(self, state: str) -> None:
        """Called on the reactor thread with kazoo's connection state (LOST, SUSPENDED, ...)."""
        self._log.info("ZooKeeper connection state is now {state}", state=state)
        if state == "LOST":
            self._session_lost = True
        elif state == "CONNECTED" and not self._stopping and self._pool is not None:
            lost, self._session_lost = self._session_lost, False
            for kind in (READ, WRITE):
                self._run(self._reconcile, kind, self._desired[kind], lost)

    # -- worker-thread side (blocking kazoo calls)

    def _log_later(self, level: LogLevel, fmt: str, **fields: Any) -> None:
        """Log from the worker thread: the event is emitted on the reactor thread."""
        self._reactor.callFromThread(self._log.emit, level, fmt, **fields)

    def _make_client(self) -> Any:
        from kazoo.client import KazooClient
        from kazoo.retry import KazooRetry

        kazoo_log = logging.getLogger(f"kestrel.serverset.kazoo.{id(self)}")
        kazoo_log.propagate = False
        if not kazoo_log.handlers:
            kazoo_log.addHandler(_KazooLogBridge(self._reactor, self._log))
        factory = self._client_factory or KazooClient
        return factory(hosts=self.hosts, timeout=self.session_timeout,
                       connection_retry=KazooRetry(max_tries=-1,
                                                   max_delay=reconnect_delay(self.session_timeout)),
                       command_retry=KazooRetry(max_tries=3, max_delay=1.0),
                       logger=kazoo_log)

    def _connect(self) -> None:
        client = self._make_client()
        self._client = client

        def on_state(state: str) -> None:
            self._reactor.callFromThread(self._state_changed, str(state))

        client.add_listener(on_state)
        # kazoo keeps retrying in the background; the CONNECTED callback joins.
        client.start_async().wait(max(self.session_timeout, 5.0))
        if not client.connected:
            self._log_later(LogLevel.warn,
                            "ZooKeeper at {hosts} is not reachable yet; will join when it is",
                            hosts=self.hosts)

    def _close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.stop()
            client.close()

    def _reconcile(self, kind: str, wanted: Membership | None, session_lost: bool) -> None:
        """Make the C{kind} membership match C{wanted} (None: no membership)."""
        client = self._client
        if client is None or not client.connected:
            return  # done again on the next CONNECTED
        member = self._members[kind]
        if session_lost or (member.path is not None and client.exists(member.path) is None):
            member.path, member.membership = None, None
        if wanted is None:
            if member.path is not None:
                client.delete(member.path)
                self._log_later(LogLevel.info, "left {kind} server set", kind=kind)
            member.path, member.membership = None, None
            return
        if member.membership is wanted:
            return
        assert self.main_endpoint is not None
        data = member_data(self.main_endpoint, self.endpoints, wanted)
        if member.path is not None and wanted is Membership.DEAD:
            client.set(member.path, data)
            member.membership = wanted
            self._log_later(LogLevel.info, "updated {kind} server set with status {membership}",
                            kind=kind, membership=wanted.value)
            return
        parent = f"{self.path_prefix}/{kind}"
        client.ensure_path(parent)
        path = client.create(f"{parent}/member_", data, ephemeral=True, sequence=True)
        old_path = member.path
        member.path, member.membership = path, wanted
        if old_path is not None:
            client.delete(old_path)
        self._log_later(LogLevel.info,
                        "joined {kind} server set as {path} with status {membership}",
                        kind=kind, path=path, membership=wanted.value)
