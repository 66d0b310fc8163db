"""
The configuration schema: every key, its default, its parser and its docs row, declared once.

L{QueueConfig} (the settings of one queue), L{ServerConfig} (the whole
file) and L{ZooKeeperConfig} are frozen attrs classes. Each field carries, in
its metadata, a L{QueueKey} or L{ServerKey}: how a config value of that key is
parsed and the row of its table in C{docs/config.md} (L{queue_keys_table},
L{server_keys_table}, L{zookeeper_keys_table}; tests keep the docs equal to
them). The YAML walk (L{kestrel.config.parse}) and the command-line overrides
(L{ServerConfig.with_overrides}) find their parsers here, so no key is listed
anywhere else. L{check_server} holds the checks that involve several keys.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from kestrel.config.problems import Problems, join_path
from kestrel.config.values import (
    BadValueError,
    Parser,
    SyncPolicy,
    optional,
    parse_boolean,
    parse_control_commands,
    parse_count,
    parse_duration,
    parse_file_mode,
    parse_journal_fsync,
    parse_port,
    parse_queue_name,
    parse_size,
    parse_status,
    parse_sync_policy,
    parse_text,
    parse_zk_port,
    positive,
    render_sync_policy,
    render_value,
    required,
    zero_if_null,
)
from kestrel.names import FANOUT_SEPARATOR, is_fanout, master_name
from kestrel.status import Status, parse_settable_status

#: The key under which a field's metadata holds its L{QueueKey} or L{ServerKey}.
_KEY = "kestrel.config_key"


def _table(cls: type, default_header: str) -> list[str]:
    """The docs table of the keys declared by the attrs class C{cls}, in field order."""
    lines = [f"| key | {default_header} | type | meaning |", "|---|---|---|---|"]
    for f in attrs.fields(cls):
        if _KEY in f.metadata:
            key = f.metadata[_KEY]
            lines.append(f"| `{f.name}` | {key.shown} | {key.kind} | {key.meaning} |")
    return lines


def _parsers(cls: type) -> dict[str, Parser]:
    """Key name -> parser of every key the attrs class C{cls} declares with a parser."""
    return {f.name: f.metadata[_KEY].parse for f in attrs.fields(cls)
            if _KEY in f.metadata and f.metadata[_KEY].parse is not None}


# -- queue keys ------------------------------------------------------------------------------


@attrs.frozen
class QueueKey:
    """
    Everything about one queue setting besides its name and default: how a
    config value is parsed (C{parse}), how a resolved value is rendered by
    C{dump_config} (C{render}), and the row of the docs table (C{shown}: the
    built-in default as written in the docs, C{kind}: the type column,
    C{meaning}).
    """

    parse: Parser
    kind: str
    shown: str
    meaning: str
    render: Callable[[Any], str] = render_value


def _setting(default: Any, parse: Parser, kind: str, shown: str,
             meaning: str, render: Callable[[Any], str] = render_value) -> Any:
    """Declare one QueueConfig field: its default and its L{QueueKey}."""
    return attrs.field(default=default, metadata={
        _KEY: QueueKey(parse=parse, kind=kind, shown=shown, meaning=meaning, render=render)})


@attrs.frozen
class QueueConfig:
    """
    The resolved settings of one queue. Every field has Kestrel's built-in default.

    Durations are float seconds (or None), sizes are bytes, and a limit of
    None means unlimited. Each field is declared once, here: its default and
    its L{QueueKey} (parser, C{dump_config} rendering, docs table row; see
    L{queue_key} and L{queue_keys_table}).
    """

    max_items: int | None = _setting(
        None, optional(parse_count), "count or null", "`null`",
        "refuse (or, with `discard_old_when_full`, drop the oldest) when the queue holds "
        "this many items; `null`: unlimited")
    max_size: int | None = _setting(
        None, optional(parse_size), "size or null", "`null`",
        "the same for the total bytes of queued items")
    max_item_size: int | None = _setting(
        None, optional(parse_size), "size or null", "`null`",
        "larger items are always refused (an item of exactly this size is accepted)")
    max_age: float | None = _setting(
        None, optional(parse_duration), "duration or null", "`null`",
        "items older than this expire (client expiries are capped to it)")
    default_journal_size: int = _setting(
        16 * 1024 * 1024, required(parse_size), "size", "`16MiB`",
        "rewrite the journal of an empty queue once it reaches this size")
    max_memory_size: int = _setting(
        128 * 1024 * 1024, required(parse_size), "size", "`128MiB`",
        "item bytes kept in memory (the rest is read back from the journal); also the "
        "journal rotation size")
    max_journal_size: int = _setting(
        1024 * 1024 * 1024, required(parse_size), "size", "`1GiB`",
        "rewrite or pack the journal once all its files total this much")
    min_journal_compact_delay: float | None = _setting(
        60.0, optional(parse_duration), "duration or null", "`1m`",
        "least time between two size-triggered rewrites; `null`: no limit")
    discard_old_when_full: bool = _setting(
        False, parse_boolean, "boolean", "`false`",
        "a full queue drops its oldest items instead of refusing new ones")
    keep_journal: bool = _setting(
        True, parse_boolean, "boolean", "`true`",
        "`false`: memory only; contents are lost on restart and an existing journal is "
        "erased when the queue is created")
    sync_journal: SyncPolicy = _setting(
        None, parse_sync_policy, "sync policy", "`never`",
        "fsync policy of the journal (see Units)", render=render_sync_policy)
    durable_acks: bool = _setting(
        False, parse_boolean, "boolean", "`false`",
        "with a `sync_journal` period: reply to a write only after the fsync that covers it "
        "(with `always` every reply already waits for its fsync)")
    expire_to_queue: str | None = _setting(
        None, optional(parse_queue_name), "queue name or null", "`null`",
        "expired items are moved to this queue instead of dropped")
    max_expire_sweep: int | None = _setting(
        None, optional(parse_count), "count or null", "`null`",
        "most items expired in one pass; `null`: no limit")
    fanout_only: bool = _setting(
        False, parse_boolean, "boolean", "`false`",
        f"the queue stores nothing itself; only its `{FANOUT_SEPARATOR}` children receive items")
    max_queue_age: float | None = _setting(
        None, optional(parse_duration), "duration or null", "`null`",
        "the sweep deletes the queue when it is empty and older than this")
    open_transaction_timeout: float | None = _setting(
        None, optional(parse_duration), "duration or null", "`null`",
        "open reads held longer than this are aborted (by a timer)")
    disable_aggressive_rewrites: bool = _setting(
        False, parse_boolean, "boolean", "`false`",
        "Kestrel's alternative, gentler rewrite policy")


def queue_key(name: str) -> QueueKey:
    """The L{QueueKey} of queue setting C{name}; C{KeyError} if there is none."""
    try:
        return attrs.fields_dict(QueueConfig)[name].metadata[_KEY]
    except KeyError:
        raise KeyError(name) from None


def queue_keys_table() -> list[str]:
    """
    The lines of the queue-keys table of C{docs/config.md} (header included),
    one row per QueueConfig field in declaration order; a test checks that
    the docs hold exactly these lines.
    """
    return _table(QueueConfig, "built-in")


def _frozen_mapping(value: Mapping[str, Any]) -> Mapping[str, Any]:
    """Return a read-only copy of C{value}."""
    return types.MappingProxyType(dict(value))


@attrs.frozen
class QueueOverride:
    """
    The settings one C{queues:} entry sets explicitly (a partial QueueConfig).

    Only keys present in the file are in C{settings}; everything else is
    inherited from the parent level.
    """

    settings: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_mapping)

    def __attrs_post_init__(self) -> None:
        unknown = set(self.settings) - _QUEUE_FIELDS
        if unknown:
            raise ValueError(f"not queue settings: {', '.join(sorted(unknown))}")

    def apply(self, parent: QueueConfig) -> QueueConfig:
        """Return C{parent} with every setting of this override replacing its value."""
        if not self.settings:
            return parent
        return attrs.evolve(parent, **self.settings)


# -- server keys -----------------------------------------------------------------------------


@attrs.frozen
class ServerKey:
    """
    Everything about one server-level (or C{zookeeper:}) setting besides its
    name and default: how a config value is parsed (C{parse}; None for the
    sections C{zookeeper}, C{default}, C{queues} and C{aliases}, which the
    YAML walk builds itself) and the row of the docs table (C{shown}: the
    default as written in the docs, C{kind}: the type column, C{meaning}).
    """

    parse: Parser | None
    kind: str
    shown: str
    meaning: str


def _server_setting(parse: Parser | None, kind: str, shown: str, meaning: str,
                    **field: Any) -> Any:
    """Declare one ServerConfig or ZooKeeperConfig field: its L{ServerKey} and attrs options."""
    return attrs.field(metadata={_KEY: ServerKey(parse=parse, kind=kind, shown=shown,
                                                 meaning=meaning)}, **field)


@attrs.frozen
class ZooKeeperConfig:
    """Where and how to publish this server in ZooKeeper server sets."""

    host: str = _server_setting(
        required(parse_text), "string", "(required)", "the ZooKeeper host")
    path_prefix: str = _server_setting(
        required(parse_text), "absolute path", "(required)",
        "the server joins `<path_prefix>/read` and `<path_prefix>/write`")
    port: int = _server_setting(
        required(parse_zk_port), "1..65535", "`2181`", "the ZooKeeper port", default=2181)
    session_timeout: float = _server_setting(
        required(positive(parse_duration)), "duration > 0", "`10s`",
        "the ZooKeeper session timeout", default=10.0)
    #: The host clients are told, used as given (loopback too); None: derived from the listener.
    advertise_host: str | None = _server_setting(
        required(parse_text), "string", "(listen address)",
        "the host clients are told, used as given (no lookup, loopback allowed)", default=None)


def _status_converter(value: Status | str) -> Status:
    """Accept a L{Status} or its (case-insensitive) name; reject Down."""
    return parse_settable_status(value)


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    """Return C{value} as a tuple (the C{warnings} converter)."""
    return tuple(value)


def _alias_converter(value: Mapping[str, Any]) -> Mapping[str, tuple[str, ...]]:
    """Return a read-only mapping of alias name to a tuple of destination names."""
    return types.MappingProxyType({k: tuple(v) for k, v in value.items()})



#: Where the status file goes when none is configured (unless that is inside queue_path).
DEFAULT_STATUS_FILE = "./kestrel-status"


def default_status_file(queue_path: str) -> str:
    """
    Return where the status file goes when C{status_file} is not configured.

    That is C{./kestrel-status}, unless it would lie inside C{queue_path}
    (C{queue_path: .}); then it is a sibling file of the queue folder,
    C{<absolute queue_path>.kestrel-status}. Only a queue_path of the file
    system root leaves no such place; the config check then asks for an
    explicit C{status_file}.
    """
    if not _inside(DEFAULT_STATUS_FILE, queue_path):
        return DEFAULT_STATUS_FILE
    return os.path.abspath(queue_path).rstrip(os.sep) + ".kestrel-status"


def _normalised(path: str) -> str:
    """C{path} made absolute, normalised and case-folded where the OS ignores case."""
    return os.path.normcase(os.path.abspath(path))


def _inside(path: str, folder: str) -> bool:
    """Whether C{path} is C{folder} or lies under it (lexically, after normalising)."""
    path_abs, folder_abs = _normalised(path), _normalised(folder)
    return path_abs == folder_abs or path_abs.startswith(folder_abs.rstrip(os.sep) + os.sep)


def _same_path(a: str, b: str) -> bool:
    """Whether two paths name the same location (lexically, after normalising)."""
    return _normalised(a) == _normalised(b)


@attrs.frozen
class ServerConfig:
    """
    The whole server configuration: server-level settings, the default queue
    settings, per-queue overrides and aliases.

    Ports of None mean "listener disabled". C{warnings} holds non-fatal
    remarks found while parsing (for example aliases masking queues); it does
    not take part in equality. Every other field is declared with its
    L{ServerKey} (see L{server_key} and L{server_keys_table}).
    """

    listen_address: str = _server_setting(
        required(parse_text), "string", "`127.0.0.1`",
        "bind address of every listener (Kestrel's default was `0.0.0.0`)",
        default="127.0.0.1")
    listen_backlog: int = _server_setting(
        required(positive(parse_count)), "count > 0", "`1024`",
        "connections each listener lets wait to be accepted (the `listen()` backlog; the kernel "
        "caps it at `net.core.somaxconn`). Twisted's default, 50, made clients connecting at "
        "once wait: a burst of 100 connections overflowed it, and each dropped connection "
        "waited a second or more for its SYN to be sent again (docs/performance.md)",
        default=1024)
    memcache_port: int | None = _server_setting(
        parse_port, "port", "`22133`", "memcache protocol", default=22133)
    text_port: int | None = _server_setting(
        parse_port, "port", "`2222`", "text protocol", default=2222)
    thrift_port: int | None = _server_setting(
        parse_port, "port", "`2229`", "thrift (framed transport, binary protocol)",
        default=2229)
    admin_port: int | None = _server_setting(
        parse_port, "port", "`2223`",
        "admin HTTP (`/ping`, `/stats.json`, `/metrics`, `/reload`, `/status`, ...)",
        default=2223)
    admin_address: str = _server_setting(
        required(parse_text), "string", "`127.0.0.1`",
        "bind address of the admin port alone; `listen_address` does not apply to it",
        default="127.0.0.1")
    admin_token: str | None = _server_setting(
        optional(parse_text), "string (16+ characters) or null", "`null`",
        "bearer token every state-changing admin request (`POST`) must carry; see "
        'docs/guide.md, "Securing control"', default=None, repr=False)
    admin_token_file: str | None = _server_setting(
        optional(parse_text), "path or null", "`null`",
        "a file whose first line is the token (read at start; keep it `0600`); set this or "
        "`admin_token`, not both", default=None)
    control_commands: str | None = _server_setting(
        optional(parse_control_commands), "`all`, `admin_only` or null", "`null`",
        "`admin_only`: `shutdown`, `reload`, `flush_all` and status changes (memcache, text, "
        "thrift `set_status`/`flush_all_queues`) are refused on the client ports; `null`: "
        "`admin_only` when a token is configured, else `all`", default=None)
    queue_path: str = _server_setting(
        required(parse_text), "path", "`./kestrel-data`",
        "journal directory, created if missing", default="./kestrel-data")
    archive_path: str | None = _server_setting(
        optional(parse_text), "path or null", "`null`",
        "dead journal files are moved here instead of deleted; must not be `queue_path` itself",
        default=None)
    journal_file_mode: int = _server_setting(
        required(parse_file_mode), "permission mode", '`"0600"`',
        "mode of every journal file the server creates (an octal string; quote it in YAML)",
        default=0o600)
    journal_fsync: str = _server_setting(
        required(parse_journal_fsync), "`reactor` or `thread`", "`reactor`",
        "where the fsyncs of `sync_journal: always` run: `reactor`: on the reactor thread, "
        "once per reactor turn for every write made in it (all connections wait for it), "
        "and the records of durable adds (`always`, or a period with `durable_acks`) reach "
        "each file in one write per turn; `thread`: in the thread pool, at once, the next "
        "one covering the writes made meanwhile", default="reactor")
    queue_path_mode: int = _server_setting(
        required(parse_file_mode), "permission mode", '`"0700"`',
        "mode of `queue_path` when the server creates it; an existing folder is left alone, "
        "with a warning if other users may enter it", default=0o700)
    status_file: str | None = _server_setting(
        optional(parse_text), "path or null", "`./kestrel-status`",
        "where the server status is kept; must not be inside `queue_path` (see \"Other "
        "checks\" for the default when it would be); `null`: status kept in memory only",
        default=attrs.Factory(lambda self: default_status_file(self.queue_path),
                              takes_self=True))
    default_status: Status = _server_setting(
        required(parse_status), "status", "`up`",
        "status when the status file is missing or unusable: `up`, `readonly`, `quiescent`, "
        "`writeavoid` (any case; `down` is refused)",
        default=Status.UP, converter=_status_converter)
    status_change_grace_period: float = _server_setting(
        zero_if_null(parse_duration), "duration (`null` = 0)", "`0s`",
        "a stricter status is reported at once but enforced only after this delay",
        default=0.0)
    expiration_timer_frequency: float | None = _server_setting(
        optional(positive(parse_duration)), "duration > 0 or null", "`1s`",
        "period of the background sweep (expired items, then queues past `max_queue_age`); "
        "`null` disables it", default=1.0)
    client_timeout: float | None = _server_setting(
        optional(positive(parse_duration)), "duration > 0 or null", "`null`",
        "close a connection idle this long; `null`: never", default=None)
    max_open_transactions: int = _server_setting(
        required(parse_count), "count", "`1`",
        "open (transactional) reads per queue per connection; `0` refuses every "
        "transactional read", default=1)
    connection_limit_refuse_writes: int | None = _server_setting(
        optional(parse_count), "count or null", "`null`",
        "a connection opened while more than N are open (itself included) refuses writes for "
        "its lifetime", default=None)
    connection_limit_refuse_reads: int | None = _server_setting(
        optional(parse_count), "count or null", "`null`", "the same for reads", default=None)
    max_request_size: int = _server_setting(
        required(positive(parse_size)), "size > 0", "`64MiB`",
        "largest memcache/text command line or thrift frame", default=64 * 1024 * 1024)
    max_client_memory: int = _server_setting(
        required(positive(parse_size)), "size >= `max_request_size`", "`256MiB`",
        "client input all connections together may hold in memory (unanswered lines, declared "
        "memcache `set` data, text `put` bodies); a request that would go over is refused "
        "before it is read (docs/reliability.md)", default=256 * 1024 * 1024)
    max_client_output: int = _server_setting(
        required(positive(parse_size)), "size > 0", "`1MiB`",
        "replies queued for one connection before the server stops reading its requests "
        "(until the client reads)", default=1024 * 1024)
    max_queues: int = _server_setting(
        required(positive(parse_count)), "count > 0", "`10000`",
        "queues the server holds (fanout children included); a request that would create one "
        "more is refused with one error line, and so is one past the file-descriptor budget "
        "(below)", default=10_000)
    zookeeper: ZooKeeperConfig | None = _server_setting(
        None, "mapping or null", "`null`", "ZooKeeper server-set publishing, see below",
        default=None)
    default: QueueConfig = _server_setting(
        None, "mapping", "(built-ins)", "queue settings every queue inherits",
        factory=QueueConfig)
    queues: Mapping[str, QueueOverride] = _server_setting(
        None, "mapping", "`{}`",
        "per-queue overrides, keyed by queue name (fanout children as `parent+child`)",
        factory=dict, converter=_frozen_mapping)
    aliases: Mapping[str, tuple[str, ...]] = _server_setting(
        None, "mapping", "`{}`", "alias name -> non-empty list of destination queue names",
        factory=dict, converter=_alias_converter)
    warnings: tuple[str, ...] = attrs.field(default=(), eq=False, converter=_strings)

    def queue_config(self, name: str) -> QueueConfig:
        """
        Return the resolved settings of queue C{name}.

        A plain queue is C{default} with its C{queues:} entry (if any) on top;
        a fanout child C{q+f} is its master C{q}'s resolved settings with the
        entry for C{q+f} (if any) on top. The name is not validated here.
        """
        if is_fanout(name):
            parent = self.queue_config(master_name(name))
        else:
            parent = self.default
        override = self.queues.get(name)
        return parent if override is None else override.apply(parent)

    @property
    def control_admin_only(self) -> bool:
        """
        Whether C{shutdown}, C{reload}, C{flush_all} and status changes are
        refused on the memcache, text and thrift ports (admin port only).

        C{control_commands: admin_only} says so; left out, it is so exactly
        when an admin token is configured.
        """
        if self.control_commands is None:
            return self.admin_token is not None or self.admin_token_file is not None
        return self.control_commands == "admin_only"

    def restart_required_changes(self, new: ServerConfig) -> list[str]:
        """
        Return the server-level keys whose value differs in C{new}, in field order.

        A reload applies only C{default}, C{queues} and C{aliases}; the keys
        returned here keep their old value until a restart, and the reload
        should say so (a logged warning).
        """
        return [f.name for f in attrs.fields(ServerConfig)
                if f.name not in _RELOADABLE and getattr(self, f.name) != getattr(new, f.name)]

    def with_overrides(self, **overrides: Any) -> ServerConfig:
        """
        Return a copy with server-level settings replaced (command-line options).

        Values take the same forms as in the YAML file (C{memcache_port=0}
        disables a listener, C{max_request_size="1MiB"}, durations as
        C{"30s"} or seconds) and are checked the same way, including the
        checks between keys (C{status_file} outside C{queue_path}). Raises
        L{ConfigError} listing every problem. C{default}, C{queues} and
        C{aliases} cannot be overridden here.

        A status file at its default place (L{default_status_file} of the old
        C{queue_path}) follows a new C{queue_path} unless C{status_file} is
        overridden too, so the default never ends up inside the queue folder.
        """
        problems = Problems("<overrides>")
        changes: dict[str, Any] = {}
        if ("queue_path" in overrides and "status_file" not in overrides
                and self.status_file == default_status_file(self.queue_path)
                and isinstance(overrides["queue_path"], str)):
            changes["status_file"] = default_status_file(overrides["queue_path"])
        for key, value in overrides.items():
            if key == "zookeeper" and (value is None or isinstance(value, ZooKeeperConfig)):
                changes[key] = value
                continue
            parser = SERVER_PARSERS.get(key)
            if parser is None:
                problems.add(None, key, "not a server-level setting that can be overridden")
                continue
            try:
                changes[key] = parser(value)
            except BadValueError as e:
                problems.add(None, key, str(e))
        result = attrs.evolve(self, **changes)
        check_server(result, problems, {})
        problems.raise_if_any()
        return result


#: The keys a reload applies in place (everything else needs a restart).
_RELOADABLE = frozenset({"default", "queues", "aliases", "warnings"})

#: The built-in defaults: what the server runs on without a config file.
DEFAULT_CONFIG = ServerConfig()

_QUEUE_FIELDS = frozenset(f.name for f in attrs.fields(QueueConfig))

#: Queue setting name -> its parser, derived from the QueueConfig declaration.
QUEUE_PARSERS: Mapping[str, Parser] = types.MappingProxyType(_parsers(QueueConfig))

#: Server-level scalar name -> its parser (sections have none), from the ServerConfig declaration.
SERVER_PARSERS: Mapping[str, Parser] = types.MappingProxyType(_parsers(ServerConfig))

#: C{zookeeper:} key -> its parser, derived from the ZooKeeperConfig declaration.
ZOOKEEPER_PARSERS: Mapping[str, Parser] = types.MappingProxyType(_parsers(ZooKeeperConfig))


def server_key(name: str) -> ServerKey:
    """The L{ServerKey} of server-level setting C{name}; C{KeyError} if there is none."""
    field = attrs.fields_dict(ServerConfig).get(name)
    if field is None or _KEY not in field.metadata:
        raise KeyError(name)
    key: ServerKey = field.metadata[_KEY]
    return key


def server_keys_table() -> list[str]:
    """
    The lines of the server-level keys table of C{docs/config.md} (header
    included), one row per ServerConfig key in declaration order.
    """
    return _table(ServerConfig, "default")


def zookeeper_keys_table() -> list[str]:
    """The lines of the C{zookeeper:} keys table of C{docs/config.md} (header included)."""
    return _table(ZooKeeperConfig, "default")


def check_server(config: ServerConfig, problems: Problems, lines: Mapping[str, int]) -> None:
    """Note problems that involve several keys (overlapping paths, aliases of aliases)."""
    if config.status_file is not None and _inside(config.status_file, config.queue_path):
        problems.add(lines.get("status_file", lines.get("queue_path")), "status_file",
                     f"must not be inside queue_path ({config.status_file!r} is in "
                     f"{config.queue_path!r})")
    if config.archive_path is not None and _same_path(config.archive_path, config.queue_path):
        problems.add(lines.get("archive_path", lines.get("queue_path")), "archive_path",
                     "must not be the same folder as queue_path")
    if config.admin_token is not None and config.admin_token_file is not None:
        problems.add(lines.get("admin_token_file", lines.get("admin_token")), "admin_token_file",
                     "set admin_token or admin_token_file, not both")
    if config.admin_token is not None and len(config.admin_token.strip()) < 16:
        problems.add(lines.get("admin_token"), "admin_token",
                     "must be at least 16 characters (a guessable token protects nothing)")
    if config.max_client_memory < config.max_request_size:
        problems.add(lines.get("max_client_memory", lines.get("max_request_size")),
                     "max_client_memory",
                     f"must be at least max_request_size ({config.max_request_size} bytes), "
                     f"or no request of the largest size could ever be read")
    for name in sorted(config.aliases):
        for destination in config.aliases[name]:
            if destination in config.aliases:
                problems.add(lines.get(join_path("aliases", name)), join_path("aliases", name),
                             f"destination {destination!r} is an alias; an alias writes "
                             "only to queues, and a queue of that name could not be read")


