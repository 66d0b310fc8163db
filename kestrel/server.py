"""
KestrelServer: the protocol-independent context every protocol factory gets.

It holds the config, the clock, the queue collection, the server status,
the global stats, the latency metrics and the version, counts sessions (for
the connection limits), owns thrift's process-wide table of open reads,
builds the reports protocols send (C{stats}, C{dump_stats}, C{dump_config}),
and offers the server-wide commands (C{reload}, C{shutdown}). It knows nothing
of sockets.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

import attrs
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from kestrel import __version__
from kestrel.budget import ClientMemory
from kestrel.collection import QueueCollection, RunInThread
from kestrel.config import ServerConfig, dump_queue_config, load_config
from kestrel.errors import ConfigError
from kestrel.external_reads import ExternalReads
from kestrel.journal.chores import Chore
from kestrel.metrics import GLOBAL_METRICS, Metrics
from kestrel.session import ClientSession
from kestrel.stats import (
    AliasReport,
    QueueReport,
    ServerReport,
    ServerStats,
    StatList,
    dump_stat_blocks,
    format_stat_blocks,
    format_stats,
    stat_entries,
)
from kestrel.status import ServerStatus, Status

#: Kestrel's per-queue counters, reported as C{q/<name>/<counter>} (queue attribute names).
QUEUE_COUNTERS = (
    "total_items", "put_items", "put_bytes", "get_items_hit", "get_items_miss", "transactions",
    "canceled_transactions", "expired_items", "discarded", "total_flushes", "journal_rewrites",
    "journal_rotations",
)


@attrs.frozen
class LatencyHistogram:
    """
    One server-wide latency metric in seconds: C{cumulative[i]} values were at
    most C{bounds[i]} seconds; C{count} values in all, summing to C{sum_seconds}.
    C{name} is Kestrel's (C{fsync_delay_usec}, ...).
    """

    name: str
    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    count: int
    sum_seconds: float


class KestrelServer:
    """
    The shared state of one server, handed to every protocol factory.

    Server-level settings (C{max_open_transactions}, connection limits) are
    read once at construction: as in Kestrel, a reload changes only the
    queues, the defaults and the aliases.

    @ivar config: the config in force; a successful L{reload} replaces its
        C{default}, C{queues} and C{aliases} only.
    @ivar shutdown_callback: what L{request_shutdown} calls (C{on_shutdown}, given
        by the service layer at construction).
    @ivar metrics: the latency distributions (L{Metrics}) sessions record and
        the admin site reports.
    """

    _log = Logger()

    def __init__(self, config: ServerConfig, clock: IReactorTime,
                 collection: QueueCollection, status: ServerStatus, *,
                 config_path: str | os.PathLike[str] | None = None,
                 version: str = __version__, metrics: Metrics | None = None,
                 on_shutdown: Callable[[], object] | None = None) -> None:
        self.config = config
        self.clock = clock
        self.collection = collection
        self.status = status
        self.stats: ServerStats = collection.stats
        self.metrics = metrics if metrics is not None else Metrics()
        self.version = version
        self.config_path = config_path
        self.max_open_transactions: int = config.max_open_transactions
        self.connection_limit_refuse_writes: int | None = config.connection_limit_refuse_writes
        self.connection_limit_refuse_reads: int | None = config.connection_limit_refuse_reads
        self.external_reads = ExternalReads(collection, clock)
        self.shutdown_callback: Callable[[], object] | None = on_shutdown
        #: Client input held by every connection together, capped by max_client_memory.
        self.client_memory = ClientMemory(config.max_client_memory, clock)
        self._next_session_id = 0
        if collection.status is None:
            collection.status = status
        if collection.on_delete is None:
            collection.on_delete = self.metrics.remove_queue

    @classmethod
    def from_config(cls, config: ServerConfig, clock: IReactorTime, *,
                    config_path: str | os.PathLike[str] | None = None,
                    run_in_thread: RunInThread | None = None,
                    file_chores: Callable[[Chore], None] | None = None,
                    version: str = __version__,
                    on_shutdown: Callable[[], object] | None = None) -> KestrelServer:
        """
        Build the collection and the status of C{config}, and the server over them.

        The collection is not started: the service layer starts it (replay).
        Every journal fsync is recorded in the server's L{Metrics}
        (C{fsync_delay_usec}, C{item_fsync_delay_usec}); each queue reports
        its journal maintenance times and sizes to its C{QueueMetrics}
        (C{metrics.queue(name)}), and every queue deleted, by a client or
        by the C{max_queue_age} sweep, has its metrics dropped.
        """
        status = ServerStatus(clock, config.status_file, config.default_status,
                              config.status_change_grace_period or 0.0)
        metrics = Metrics()
        collection = QueueCollection(config, clock, run_in_thread=run_in_thread,
                                     file_chores=file_chores, status=status,
                                     on_fsync=metrics.record_fsync,
                                     queue_observer=metrics.queue,
                                     on_delete=metrics.remove_queue)
        return cls(config, clock, collection, status, config_path=config_path, version=version,
                   metrics=metrics, on_shutdown=on_shutdown)

    # -- sessions ----------------------------------------------------------

    def new_session(self, protocol: object = "memcache") -> ClientSession:
        """
        Open the session of a new connection.

        C{protocol} names the wire protocol (a string) or is the protocol
        instance itself; it serves only for logging.
        """
        name = protocol if isinstance(protocol, str) else type(protocol).__name__
        return ClientSession(self, name)

    def session_opened(self) -> tuple[int, bool, bool]:
        """
        Count a new session; return its id and whether it must refuse writes
        and reads (the live session count, itself included, exceeds a limit).
        """
        self._next_session_id += 1
        stats = self.stats
        stats.curr_connections += 1
        stats.total_connections += 1
        count = stats.curr_connections
        writes = self.connection_limit_refuse_writes
        reads = self.connection_limit_refuse_reads
        return (self._next_session_id,
                writes is not None and count > writes,
                reads is not None and count > reads)

    def session_closed(self) -> None:
        """Count the end of a session."""
        self.stats.curr_connections -= 1

    # -- reports -------------------------------------------------------------

    def stats_entries(self) -> StatList:
        """Every entry of the memcache C{STATS} reply now, in Kestrel's order."""
        return stat_entries(self.stats, now=self.clock.seconds(), version=self.version,
                            source=self.collection)

    def dump_stats(self, names: Sequence[str] = ()) -> list[tuple[str, StatList]]:
        """
        The C{DUMP_STATS} report: C{(name, stats)} per queue or alias in
        C{names} (default: every queue, then every alias); [] for an unknown name.
        """
        return dump_stat_blocks(self.collection, names)

    def dump_config(self, names: Sequence[str] = ()) -> list[tuple[str, list[str]]]:
        """
        The C{DUMP_CONFIG} report: C{(name, lines)} per queue in C{names}
        (default: every queue, aliases excluded), the lines being its resolved
        settings as L{dump_queue_config} renders them.
        """
        config = self.config
        return [(name, dump_queue_config(config.queue_config(name)))
                for name in names or self.collection.queue_names(include_aliases=False)]

    def stats_text(self) -> str:
        """The memcache C{STATS} reply text now (L{stats_entries}, formatted)."""
        return format_stats(self.stats_entries())

    def dump_stats_text(self, names: Sequence[str] = ()) -> str:
        """The memcache C{DUMP_STATS} reply text of L{dump_stats}(C{names})."""
        return format_stat_blocks(self.dump_stats(names))

    def dump_config_text(self, names: Sequence[str] = ()) -> str:
        """
        The memcache C{DUMP_CONFIG} reply text of L{dump_config}(C{names}):
        C{queue '<name>' {} blocks of indented C{key=value} lines, then C{END}.
        """
        lines: list[str] = []
        for name, settings in self.dump_config(names):
            lines.append(f"queue '{name}' {{")
            lines.extend(f"  {line}" for line in settings)
            lines.append("}")
        return "\r\n".join(lines) + "\r\nEND\r\n"

    def reported_status(self) -> Status:
        """The server status now, as reported to clients (see L{ServerStatus.status})."""
        return self.status.status

    def set_status(self, name: str | Status) -> Status:
        """Ask for status C{name}; return the new reported status (L{ServerStatus.set_status})."""
        return self.status.set_status(name)

    def server_report(self) -> ServerReport:
        """The server-wide counters, totals, connection count, uptime and status now."""
        collection, stats, status = self.collection, self.stats, self.status
        return ServerReport(
            counters=stats.counters(),
            items=collection.current_items(),
            bytes=collection.current_bytes(),
            reserved_memory_ratio=collection.reserved_memory_ratio(),
            connections=stats.curr_connections,
            uptime=stats.uptime(self.clock.seconds()),
            version=self.version,
            status=status.status.display_name,
            readable=status.readable,
            writeable=status.writeable,
            queues_loading=collection.queues_loading(),
        )

    def loading_queue_names(self) -> list[str]:
        """The queues still replaying their journal at startup (none once the server is ready)."""
        return self.collection.loading_names()

    def queue_reports(self) -> list[QueueReport]:
        """One L{QueueReport} per live queue (aliases excluded), in the collection's order."""
        collection = self.collection
        reports = []
        for name in collection.queue_names(include_aliases=False):
            queue = collection.queue(name, create=False)
            if queue is None:
                continue
            config = queue.config
            reports.append(QueueReport(
                name=name, items=queue.length, bytes=queue.bytes,
                max_items=config.max_items, max_bytes=config.max_size,
                journal_bytes=queue.journal_bytes,
                mem_items=queue.memory_length, mem_bytes=queue.memory_bytes,
                age_ms=queue.age, waiters=queue.waiter_count,
                open_transactions=queue.open_read_count,
                create_time=queue.create_time,
                counters={counter: getattr(queue, counter) for counter in QUEUE_COUNTERS},
            ))
        return reports

    def alias_reports(self) -> list[AliasReport]:
        """One L{AliasReport} per alias."""
        collection = self.collection
        reports = []
        for name in collection.alias_names():
            alias = collection.alias(name)
            if alias is not None:
                reports.append(AliasReport(name=name, put_items=alias.put_items,
                                           put_bytes=alias.put_bytes,
                                           create_time=alias.create_time))
        return reports

    def latency_summaries(self) -> dict[str, Mapping[str, int | float]]:
        """
        Every latency metric's Ostrich summary by name: the global ones, then
        C{q/<queue>/<metric>} for each live queue that has recorded any.
        """
        metrics = self.metrics
        report: dict[str, Mapping[str, int | float]] = {
            name: h.summary() for name, h in metrics.global_items()}
        live = set(self.collection.queue_names(include_aliases=False))
        for name in metrics.queue_names():
            if name in live:
                for metric, h in metrics.queue(name).items():
                    report[f"q/{name}/{metric}"] = h.summary()
        return report

    def latency_histograms(self, bounds: Sequence[float]) -> list[LatencyHistogram]:
        """
        The global time metrics (C{*_usec}, C{*_msec}) as L{LatencyHistogram}s
        in seconds, counted at the upper C{bounds} (seconds, ascending).
        """
        out = []
        for name in GLOBAL_METRICS:
            if name.endswith("_usec"):
                scale = 1e-6
            elif name.endswith("_msec"):
                scale = 1e-3
            else:
                continue
            h = getattr(self.metrics, name)
            counts = h.cumulative(tuple(int(b / scale) for b in bounds))
            out.append(LatencyHistogram(name=name, bounds=tuple(bounds),
                                        cumulative=tuple(counts), count=h.count,
                                        sum_seconds=h.total * scale))
        return out

    # -- server-wide commands ----------------------------------------------

    def delete_queue(self, name: str) -> None:
        """
        Delete queue C{name} (see L{QueueCollection.delete}); the collection's
        C{on_delete} hook, which the server always sets, forgets its metrics.
        """
        self.collection.delete(name)

    def reload(self) -> None:
        """
        Reread the config file (if the server has one) and apply its
        C{default}, C{queues} and C{aliases} to the collection; C{config}
        then holds the new queue part and the old server-level settings.

        A broken or unreadable file raises L{ConfigError} naming the problem;
        the config in force is kept. Server-level keys whose value in the file
        differs from the one in force are not applied; a warning names them
        (C{keys}: they need a restart).
        """
        if self.config_path is None:
            config = self.config
        else:
            try:
                config = load_config(self.config_path)
            except ConfigError as e:
                self._log.error("Reload of {path} failed; config kept: {problems}",
                                path=os.fspath(self.config_path), problems=str(e))
                raise
            except (OSError, ValueError) as e:
                self._log.error("Reload of {path} failed; config kept: {error}",
                                path=os.fspath(self.config_path), error=str(e))
                raise ConfigError([f"{os.fspath(self.config_path)}: {e}"]) from e
        # Only the queue part changes; server-level settings need a restart.
        restart_keys = self.config.restart_required_changes(config)
        if restart_keys:
            self._log.warn("Reload: {keys} changed but need a restart to take effect "
                           "(command-line options still override the file)",
                           keys=", ".join(restart_keys))
        config = attrs.evolve(self.config, default=config.default, queues=config.queues,
                              aliases=config.aliases)
        self.collection.reload(config)
        self.config = config
        self._log.info("Config reloaded")

    def request_shutdown(self) -> None:
        """Ask the service layer to stop the server (through C{shutdown_callback})."""
        self._log.info("Shutdown requested")
        if self.shutdown_callback is None:
            self._log.warn("No shutdown callback set; shutdown request ignored")
            return
        self.shutdown_callback()
