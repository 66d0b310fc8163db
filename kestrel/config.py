"""
Configuration: the YAML schema, its defaults, and per-queue resolution.

C{docs/config.md}
documents every key of the schema. L{parse_config} is pure (no I/O): it checks the whole
file and raises one L{ConfigError} listing every problem, each naming its
dotted key path and line. L{load_config} reads a file and parses it.

Per-queue settings resolve as Kestrel 2.4 does:
built-in defaults, then the C{default:} section, then the queue's own entry
under C{queues:}, then, for a fanout child C{q+f}, the child's entry on top of
its master C{q}'s resolved settings.
"""

from __future__ import annotations

import json
import math
import os
import re
import types
from collections.abc import Callable, Iterator, Mapping
from fractions import Fraction
from typing import Any, NoReturn

import attrs
import yaml
from twisted.logger import Logger

from kestrel.errors import ConfigError, ForbiddenStatus, InvalidQueueName, UnknownStatus
from kestrel.names import FANOUT_SEPARATOR, is_fanout, master_name, validate_queue_name
from kestrel.status import Status, parse_settable_status

#: Sync policy: None = never fsync on write, 0.0 = fsync every write, > 0 = period in seconds.
SyncPolicy = float | None

_log = Logger(namespace="kestrel.config")


# -- value parsers ---------------------------------------------------------------------------


class _BadValueError(ValueError):
    """A value that does not fit its key; the message says what was expected."""


_SIZE_UNITS = {
    "": 1, "b": 1, "byte": 1, "bytes": 1,
    "kb": 1024, "kib": 1024,
    "mb": 1024 ** 2, "mib": 1024 ** 2,
    "gb": 1024 ** 3, "gib": 1024 ** 3,
}
_DURATION_UNITS = {"": 1, "ms": Fraction(1, 1000), "s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZE_EXPECTED = "expected a size: bytes, or a string like '512KiB', '16MiB', '1GiB'"
_DURATION_EXPECTED = "expected a duration like '250ms', '30s', '5m', '1h', '1d' or seconds"
_STATUS_EXPECTED = "expected up, readonly, quiescent or writeavoid"
_NUMBER_WITH_UNIT = re.compile(
    r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*\Z")


def _describe(value: object) -> str:
    """A short description of a bad value for an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return repr(value)


def _describe_node(node: yaml.Node) -> str:
    """A short description of a YAML node for an error message (never fails)."""
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if node.tag == "tag:yaml.org,2002:null":
        return "null"
    return repr(node.value)


def parse_size(value: object) -> int:
    """
    Return the size C{value} in bytes.

    An integer is bytes; a string is a number and a unit, C{B}/C{bytes},
    C{KiB}/C{KB}, C{MiB}/C{MB}, C{GiB}/C{GB} (all powers of 1024; units are
    case-insensitive, C{1.5KiB} is allowed if it comes to whole bytes). Raises
    C{ValueError} for anything else, including negative sizes.
    """
    if isinstance(value, bool):
        raise _BadValueError(f"{_SIZE_EXPECTED}, got {_describe(value)}")
    if isinstance(value, int):
        amount = Fraction(value)
    elif isinstance(value, str):
        match = _NUMBER_WITH_UNIT.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _SIZE_UNITS:
            raise _BadValueError(f"{_SIZE_EXPECTED}, got {value!r}")
        amount = Fraction(match.group(1)) * _SIZE_UNITS[unit]
    else:
        raise _BadValueError(f"{_SIZE_EXPECTED}, got {_describe(value)}")
    if amount < 0:
        raise _BadValueError(f"a size cannot be negative, got {value!r}")
    if amount.denominator != 1:
        raise _BadValueError(f"a size must come to a whole number of bytes, got {value!r}")
    return int(amount)


def parse_duration(value: object) -> float:
    """
    Return the duration C{value} in seconds (a float).

    A number is seconds; a string is a number with an optional unit, C{ms},
    C{s}, C{m}, C{h} or C{d} (case-sensitive: C{250ms}, C{30s}, C{1.5h}). Raises
    C{ValueError} for anything else, including negative or infinite values.
    C{null} is handled by the caller (it means "none" for optional keys).
    """
    if isinstance(value, bool):
        raise _BadValueError(f"{_DURATION_EXPECTED}, got {_describe(value)}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise _BadValueError(f"a duration must be finite, got {value!r}")
        seconds = float(value)
    elif isinstance(value, str):
        match = _NUMBER_WITH_UNIT.match(value)
        if match is None or match.group(2) not in _DURATION_UNITS:
            raise _BadValueError(f"{_DURATION_EXPECTED}, got {value!r}")
        seconds = float(Fraction(match.group(1)) * _DURATION_UNITS[match.group(2)])
    else:
        raise _BadValueError(f"{_DURATION_EXPECTED}, got {_describe(value)}")
    if seconds < 0:
        raise _BadValueError(f"a duration cannot be negative, got {value!r}")
    return seconds


def parse_sync_policy(value: object) -> SyncPolicy:
    """
    Return the C{sync_journal} policy of C{value}.

    C{never} (or C{null}) gives None (no fsync on write), C{always} gives 0.0
    (fsync every write), a duration gives its period in seconds (a zero
    duration is the same as C{always}). Raises C{ValueError} otherwise.
    """
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in ("never", "always"):
        return None if value.strip().lower() == "never" else 0.0
    try:
        return parse_duration(value)
    except _BadValueError:
        raise _BadValueError("expected never, always or a duration (fsync period) "
                             f"like '100ms', got {_describe(value)}") from None


def _parse_int(value: object, what: str) -> int:
    """An integer (a decimal string is accepted too), for counts and ports."""
    if isinstance(value, bool):
        raise _BadValueError(f"expected {what}, got {_describe(value)}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    raise _BadValueError(f"expected {what}, got {_describe(value)}")


def _count(value: object) -> int:
    """A non-negative integer."""
    number = _parse_int(value, "a whole number")
    if number < 0:
        raise _BadValueError(f"cannot be negative, got {number}")
    return number


def _port(value: object) -> int | None:
    """A TCP port; 0 or null disables the listener (None)."""
    if value is None:
        return None
    number = _parse_int(value, "a port number (0 or null: disabled)")
    if not 0 <= number <= 65535:
        raise _BadValueError(f"a port must be between 0 and 65535, got {number}")
    return number or None


def _file_mode(value: object) -> int:
    """A permission mode: an octal string (C{"0600"}, C{"600"}) or an integer (C{0o600})."""
    if isinstance(value, str) and re.fullmatch(r"\s*0?o?[0-7]{3}\s*", value):
        number = int(value.strip().replace("o", ""), 8)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise _BadValueError(f"expected a permission mode like '0600', got {_describe(value)}")
    if not 0 <= number <= 0o777:
        raise _BadValueError(f"a permission mode must be between 0000 and 0777 (quote it: "
                             f"'0600'), got {value!r}")
    return number


def _control_commands(value: object) -> str:
    """C{all} or C{admin_only}."""
    if value not in ("all", "admin_only"):
        raise _BadValueError(f"expected all or admin_only, got {_describe(value)}")
    return str(value)


def _zk_port(value: object) -> int:
    """A TCP port between 1 and 65535."""
    number = _parse_int(value, "a port number")
    if not 1 <= number <= 65535:
        raise _BadValueError(f"a port must be between 1 and 65535, got {number}")
    return number


def _boolean(value: object) -> bool:
    """A YAML boolean (true/false, yes/no, on/off)."""
    if not isinstance(value, bool):
        raise _BadValueError(f"expected true or false, got {_describe(value)}")
    return value


def _text(value: object) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise _BadValueError(f"expected a non-empty string, got {_describe(value)}")
    return value


def _queue_name(value: object) -> str:
    """A valid queue name."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    name = _text(value)
    try:
        return validate_queue_name(name)
    except InvalidQueueName as e:
        raise _BadValueError(str(e)) from None


def _status(value: object) -> Status:
    """A status a server may start in: up, readonly, quiescent or writeavoid."""
    if not isinstance(value, (str, Status)):
        raise _BadValueError(f"{_STATUS_EXPECTED}, got {_describe(value)}")
    try:
        return parse_settable_status(value)
    except UnknownStatus:
        raise _BadValueError(f"{_STATUS_EXPECTED}, got {value!r}") from None
    except ForbiddenStatus:
        raise _BadValueError("down cannot be a default status "
                       "(use up, readonly, quiescent or writeavoid)") from None


def _optional(parser: Callable[[object], Any]) -> Callable[[object], Any]:
    """The same parser, with null meaning None."""

    def parse(value: object) -> Any:
        return None if value is None else parser(value)

    return parse


def _required(parser: Callable[[object], Any]) -> Callable[[object], Any]:
    """The same parser, refusing null."""

    def parse(value: object) -> Any:
        if value is None:
            raise _BadValueError("cannot be null here")
        return parser(value)

    return parse


def _positive(parser: Callable[[object], Any]) -> Callable[[object], Any]:
    """The same parser, refusing zero."""

    def parse(value: object) -> Any:
        result = parser(value)
        if result is not None and result <= 0:
            raise _BadValueError(f"must be greater than zero, got {_describe(value)}")
        return result

    return parse


def _zero_if_null(parser: Callable[[object], float]) -> Callable[[object], float]:
    """The same parser, with null meaning 0."""

    def parse(value: object) -> float:
        return 0.0 if value is None else parser(value)

    return parse


# -- queue keys: one declaration ------------------------------------------------------------


def _render_duration(seconds: float) -> str:
    """A duration in the config's own notation (C{250ms}, C{60s}), exact and re-parsable."""
    candidates = []
    if 0 < seconds < 1:
        candidates.append(f"{round(seconds * 1000)}ms")
    if seconds == int(seconds):
        candidates.append(f"{int(seconds)}s")
    for text in candidates:
        if parse_duration(text) == seconds:
            return text
    return f"{seconds!r}s"


def _render_value(value: Any) -> str:
    """
    A setting in config-file notation: integers plain, durations with a unit,
    booleans C{true}/C{false}, None as C{null}, and strings quoted when YAML
    would read them back as something else.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _render_duration(value)
    if isinstance(value, str) and yaml.safe_load(value) != value:
        return json.dumps(value)  # quoted: "no", "123" or "null" would read back as non-strings
    return str(value)


def _render_sync_policy(value: SyncPolicy) -> str:
    """C{never}, C{always} or the fsync period."""
    if value is None:
        return "never"
    if value == 0:
        return "always"
    return _render_duration(value)


@attrs.frozen
class QueueKey:
    """
    Everything about one queue setting besides its name and default: how a
    config value is parsed (C{parse}), how a resolved value is rendered by
    C{dump_config} (C{render}), and the row of the docs table (C{shown}: the
    built-in default as written in the docs, C{kind}: the type column,
    C{meaning}).
    """

    parse: Callable[[object], Any]
    kind: str
    shown: str
    meaning: str
    render: Callable[[Any], str] = _render_value


#: The key under which a QueueConfig field's metadata holds its L{QueueKey}.
_KEY = "kestrel.queue_key"


def _setting(default: Any, parse: Callable[[object], Any], kind: str, shown: str,
             meaning: str, render: Callable[[Any], str] = _render_value) -> Any:
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
        None, _optional(_count), "count or null", "`null`",
        "refuse (or, with `discard_old_when_full`, drop the oldest) when the queue holds "
        "this many items; `null`: unlimited")
    max_size: int | None = _setting(
        None, _optional(parse_size), "size or null", "`null`",
        "the same for the total bytes of queued items")
    max_item_size: int | None = _setting(
        None, _optional(parse_size), "size or null", "`null`",
        "larger items are always refused (an item of exactly this size is accepted)")
    max_age: float | None = _setting(
        None, _optional(parse_duration), "duration or null", "`null`",
        "items older than this expire (client expiries are capped to it)")
    default_journal_size: int = _setting(
        16 * 1024 * 1024, _required(parse_size), "size", "`16MiB`",
        "rewrite the journal of an empty queue once it reaches this size")
    max_memory_size: int = _setting(
        128 * 1024 * 1024, _required(parse_size), "size", "`128MiB`",
        "item bytes kept in memory (the rest is read back from the journal); also the "
        "journal rotation size")
    max_journal_size: int = _setting(
        1024 * 1024 * 1024, _required(parse_size), "size", "`1GiB`",
        "rewrite or pack the journal once all its files total this much")
    min_journal_compact_delay: float | None = _setting(
        60.0, _optional(parse_duration), "duration or null", "`1m`",
        "least time between two size-triggered rewrites; `null`: no limit")
    discard_old_when_full: bool = _setting(
        False, _boolean, "boolean", "`false`",
        "a full queue drops its oldest items instead of refusing new ones")
    keep_journal: bool = _setting(
        True, _boolean, "boolean", "`true`",
        "`false`: memory only; contents are lost on restart and an existing journal is "
        "erased when the queue is created")
    sync_journal: SyncPolicy = _setting(
        None, parse_sync_policy, "sync policy", "`never`",
        "fsync policy of the journal (see Units)", render=_render_sync_policy)
    durable_acks: bool = _setting(
        False, _boolean, "boolean", "`false`",
        "with a `sync_journal` period: reply to a write only after the fsync that covers it "
        "(with `always` every reply already waits for its fsync)")
    expire_to_queue: str | None = _setting(
        None, _optional(_queue_name), "queue name or null", "`null`",
        "expired items are moved to this queue instead of dropped")
    max_expire_sweep: int | None = _setting(
        None, _optional(_count), "count or null", "`null`",
        "most items expired in one pass; `null`: no limit")
    fanout_only: bool = _setting(
        False, _boolean, "boolean", "`false`",
        f"the queue stores nothing itself; only its `{FANOUT_SEPARATOR}` children receive items")
    max_queue_age: float | None = _setting(
        None, _optional(parse_duration), "duration or null", "`null`",
        "the sweep deletes the queue when it is empty and older than this")
    open_transaction_timeout: float | None = _setting(
        None, _optional(parse_duration), "duration or null", "`null`",
        "open reads held longer than this are aborted (by a timer)")
    disable_aggressive_rewrites: bool = _setting(
        False, _boolean, "boolean", "`false`",
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
    lines = ["| key | built-in | type | meaning |", "|---|---|---|---|"]
    for f in attrs.fields(QueueConfig):
        key: QueueKey = f.metadata[_KEY]
        lines.append(f"| `{f.name}` | {key.shown} | {key.kind} | {key.meaning} |")
    return lines


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


@attrs.frozen
class ZooKeeperConfig:
    """Where and how to publish this server in ZooKeeper server sets."""

    host: str
    path_prefix: str
    port: int = 2181
    session_timeout: float = 10.0
    #: The host clients are told, used as given (loopback too); None: derived from the listener.
    advertise_host: str | None = None


def _status_converter(value: Status | str) -> Status:
    """Accept a L{Status} or its (case-insensitive) name; reject Down."""
    return parse_settable_status(value)


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
    not take part in equality.
    """

    listen_address: str = "127.0.0.1"
    listen_backlog: int = 1024
    memcache_port: int | None = 22133
    text_port: int | None = 2222
    thrift_port: int | None = 2229
    admin_port: int | None = 2223
    queue_path: str = "./kestrel-data"
    archive_path: str | None = None
    status_file: str | None = attrs.field(
        default=attrs.Factory(lambda self: default_status_file(self.queue_path), takes_self=True))
    default_status: Status = attrs.field(default=Status.UP, converter=_status_converter)
    status_change_grace_period: float = 0.0
    expiration_timer_frequency: float | None = 1.0
    client_timeout: float | None = None
    max_open_transactions: int = 1
    connection_limit_refuse_writes: int | None = None
    connection_limit_refuse_reads: int | None = None
    max_request_size: int = 64 * 1024 * 1024
    admin_address: str = "127.0.0.1"
    admin_token: str | None = attrs.field(default=None, repr=False)
    admin_token_file: str | None = None
    control_commands: str | None = None
    max_client_memory: int = 256 * 1024 * 1024
    max_client_output: int = 1024 * 1024
    max_queues: int = 10_000
    journal_file_mode: int = 0o600
    queue_path_mode: int = 0o700
    zookeeper: ZooKeeperConfig | None = None
    default: QueueConfig = attrs.field(factory=QueueConfig)
    queues: Mapping[str, QueueOverride] = attrs.field(factory=dict, converter=_frozen_mapping)
    aliases: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict,
                                                         converter=_alias_converter)
    warnings: tuple[str, ...] = attrs.field(default=(), eq=False, converter=tuple)

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
        problems = _Problems("<overrides>")
        changes: dict[str, Any] = {}
        if ("queue_path" in overrides and "status_file" not in overrides
                and self.status_file == default_status_file(self.queue_path)
                and isinstance(overrides["queue_path"], str)):
            changes["status_file"] = default_status_file(overrides["queue_path"])
        for key, value in overrides.items():
            if key == "zookeeper" and (value is None or isinstance(value, ZooKeeperConfig)):
                changes[key] = value
                continue
            parser = _SERVER_SCALARS.get(key)
            if parser is None:
                problems.add(None, key, "not a server-level setting that can be overridden")
                continue
            try:
                changes[key] = parser(value)
            except _BadValueError as e:
                problems.add(None, key, str(e))
        result = attrs.evolve(self, **changes)
        _check_server(result, problems, {})
        problems.raise_if_any()
        return result


#: The keys a reload applies in place (everything else needs a restart).
_RELOADABLE = frozenset({"default", "queues", "aliases", "warnings"})

#: The built-in defaults: what the server runs on without a config file.
DEFAULT_CONFIG = ServerConfig()


_QUEUE_FIELDS = frozenset(f.name for f in attrs.fields(QueueConfig))

#: Queue setting name -> its parser, derived from the QueueConfig declaration.
_QUEUE_KEYS: dict[str, Callable[[object], Any]] = {
    f.name: f.metadata[_KEY].parse for f in attrs.fields(QueueConfig)}


_SERVER_SCALARS: dict[str, Callable[[object], Any]] = {
    "listen_address": _required(_text),
    "listen_backlog": _required(_positive(_count)),
    "memcache_port": _port,
    "text_port": _port,
    "thrift_port": _port,
    "admin_port": _port,
    "queue_path": _required(_text),
    "archive_path": _optional(_text),
    "status_file": _optional(_text),
    "default_status": _required(_status),
    "status_change_grace_period": _zero_if_null(parse_duration),
    "expiration_timer_frequency": _optional(_positive(parse_duration)),
    "client_timeout": _optional(_positive(parse_duration)),
    "max_open_transactions": _required(_count),
    "connection_limit_refuse_writes": _optional(_count),
    "connection_limit_refuse_reads": _optional(_count),
    "max_request_size": _required(_positive(parse_size)),
    "admin_address": _required(_text),
    "admin_token": _optional(_text),
    "admin_token_file": _optional(_text),
    "control_commands": _optional(_control_commands),
    "max_client_memory": _required(_positive(parse_size)),
    "max_client_output": _required(_positive(parse_size)),
    "max_queues": _required(_positive(_count)),
    "journal_file_mode": _required(_file_mode),
    "queue_path_mode": _required(_file_mode),
}

_ZOOKEEPER_KEYS: dict[str, Callable[[object], Any]] = {
    "host": _required(_text),
    "port": _required(_zk_port),
    "path_prefix": _required(_text),
    "session_timeout": _required(_positive(parse_duration)),
    "advertise_host": _required(_text),
}

# -- the YAML walk ---------------------------------------------------------------------------


class _Problems:
    """Collects every problem of one config source, each with key path and line."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[tuple[int, str]] = []

    def add(self, node: yaml.Node | int | None, path: str, message: str) -> None:
        """Record a problem at C{path}; C{node} (or a 0-based line) locates it."""
        line = node.start_mark.line if isinstance(node, yaml.Node) else node
        where = self.source if line is None else f"{self.source}:{line + 1}"
        text = f"{where}: {path}: {message}" if path else f"{where}: {message}"
        self.items.append((-1 if line is None else line, text))

    def raise_if_any(self) -> None:
        """Raise one L{ConfigError} with every problem, ordered by line."""
        if self.items:
            raise ConfigError([text for _, text in sorted(self.items, key=lambda i: i[0])])


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _Walker:
    """Turns a composed YAML document into checked Python values, noting problems."""

    def __init__(self, loader: yaml.SafeLoader, problems: _Problems) -> None:
        self.loader = loader
        self.problems = problems
        #: 0-based line of every key seen, by dotted path.
        self.lines: dict[str, int] = {}

    def value(self, node: yaml.Node) -> Any:
        """The Python value of a node (anchors and tags resolved as YAML does)."""
        return self.loader.construct_object(node, deep=True)

    def entries(self, node: yaml.Node, path: str) -> Iterator[tuple[str, yaml.Node, yaml.Node]]:
        """
        Yield (key, key node, value node) of a mapping node, once per key.

        Merge keys (C{<<: *anchor}) are applied; a key given twice is a
        problem; a non-mapping node is a problem and yields nothing.
        """
        if not isinstance(node, yaml.MappingNode):
            self.problems.add(node, path, f"expected a mapping, got {_describe_node(node)}")
            return
        explicit = {id(k) for k, _ in node.value}
        try:
            self.loader.flatten_mapping(node)
        except yaml.YAMLError as e:
            self.problems.add(node, path, f"bad merge key: {e}")
            return
        chosen: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        from_explicit: set[str] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                self.problems.add(key_node, path, "keys must be plain names")
                continue
            key = key_node.value
            if id(key_node) in explicit or _join(path, key) not in self.lines:
                self.lines[_join(path, key)] = key_node.start_mark.line
            if id(key_node) in explicit:
                if key in from_explicit:
                    self.problems.add(key_node, _join(path, key), "duplicate key")
                    continue
                from_explicit.add(key)
            chosen[key] = (key_node, value_node)
        for key, (key_node, value_node) in chosen.items():
            yield key, key_node, value_node

    def scalar(self, node: yaml.Node, path: str,
               parser: Callable[[object], Any]) -> tuple[bool, Any]:
        """Parse one value; return (ok, value), noting a problem when not ok."""
        try:
            return True, parser(self.value(node))
        except _BadValueError as e:
            self.problems.add(node, path, str(e))
        except yaml.YAMLError as e:
            self.problems.add(node, path, f"bad value: {e}")
        return False, None

    def queue_settings(self, node: yaml.Node, path: str) -> dict[str, Any]:
        """The explicitly set queue keys of a C{default:} or C{queues.<q>:} mapping."""
        settings: dict[str, Any] = {}
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
            return settings
        for key, key_node, value_node in self.entries(node, path):
            parser = _QUEUE_KEYS.get(key)
            if parser is None:
                self.problems.add(key_node, _join(path, key), "unknown queue setting")
                continue
            ok, value = self.scalar(value_node, _join(path, key), parser)
            if ok:
                settings[key] = value
        return settings


def parse_config(text: str, source: str = "<string>") -> ServerConfig:
    """
    Parse and check a YAML config document; return the resulting ServerConfig.

    Every key is optional (an empty document gives L{DEFAULT_CONFIG}). All
    problems of the document are collected and raised together as one
    L{ConfigError}; each names C{source}, its line and the dotted key path
    (C{queues.weather.max_items}). Non-fatal remarks (aliases masking queues,
    C{durable_acks} without fsync) end up in C{warnings} and are logged.
    Pure: reads no file and touches nothing.
    """
    problems = _Problems(source)
    try:
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as e:
        _syntax_error(problems, text, e)
    try:
        try:
            root = loader.get_single_node()
        except yaml.YAMLError as e:
            _syntax_error(problems, text, e)
        config, lines = _build(_Walker(loader, problems), root)
    finally:
        loader.dispose()
    _check_server(config, problems, lines)
    problems.raise_if_any()
    warnings = _warnings(config)
    for warning in warnings:
        _log.warn("{source}: {warning}", source=source, warning=warning)
    return attrs.evolve(config, warnings=warnings)


def _syntax_error(problems: _Problems, text: str, error: yaml.YAMLError) -> NoReturn:
    """Raise a L{ConfigError} for a document that is not YAML at all, with its line."""
    if isinstance(error, yaml.reader.ReaderError):
        line: int | None = text.count("\n", 0, error.position)
        character = error.character
        if isinstance(character, int):
            character = chr(character)
        message = f"character {character!r} is not allowed in YAML ({error.reason})"
    else:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        line = mark.line if mark is not None else None
        message = str(getattr(error, "problem", None) or error)
    problems.add(line, "", f"YAML syntax error: {message}")
    problems.raise_if_any()
    raise AssertionError("unreachable")  # pragma: no cover


def _build(walker: _Walker, root: yaml.Node | None) -> tuple[ServerConfig, dict[str, int]]:
    """Build a ServerConfig from the root node; also return each top-level key's line."""
    problems = walker.problems
    fields: dict[str, Any] = {}
    lines = walker.lines
    if root is None or (isinstance(root, yaml.ScalarNode)
                        and root.tag == "tag:yaml.org,2002:null"):
        return DEFAULT_CONFIG, lines
    for key, key_node, value_node in walker.entries(root, ""):
        if key in _SERVER_SCALARS:
            ok, value = walker.scalar(value_node, key, _SERVER_SCALARS[key])
            if ok:
                fields[key] = value
        elif key == "zookeeper":
            fields[key] = _build_zookeeper(walker, value_node)
        elif key == "default":
            fields[key] = QueueOverride(walker.queue_settings(value_node, key)).apply(QueueConfig())
        elif key == "queues":
            fields[key] = _build_queues(walker, value_node)
        elif key == "aliases":
            fields[key] = _build_aliases(walker, value_node)
        else:
            problems.add(key_node, key, "unknown setting")
    return ServerConfig(**fields), lines


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"


def _build_zookeeper(walker: _Walker, node: yaml.Node) -> ZooKeeperConfig | None:
    """The C{zookeeper:} section: null, or host, path_prefix and optional port/session_timeout."""
    if _is_null(node):
        return None
    values: dict[str, Any] = {}
    complete = isinstance(node, yaml.MappingNode)
    for key, key_node, value_node in walker.entries(node, "zookeeper"):
        path = _join("zookeeper", key)
        parser = _ZOOKEEPER_KEYS.get(key)
        if parser is None:
            walker.problems.add(key_node, path, "unknown zookeeper setting")
            complete = False
            continue
        ok, value = walker.scalar(value_node, path, parser)
        if ok:
            values[key] = value
        complete = complete and ok
    if not isinstance(node, yaml.MappingNode):
        return None
    present = {k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
    for key in ("host", "path_prefix"):
        if key not in present:
            walker.problems.add(node, _join("zookeeper", key), "required when zookeeper is set")
            complete = False
    prefix = values.get("path_prefix")
    if prefix is not None and not prefix.startswith("/"):
        walker.problems.add(node, "zookeeper.path_prefix",
                            f"must be an absolute ZooKeeper path starting with '/', got {prefix!r}")
        complete = False
    return ZooKeeperConfig(**values) if complete else None


def _named_entries(walker: _Walker, node: yaml.Node, section: str,
                   what: str) -> Iterator[tuple[str, str, yaml.Node]]:
    """
    Yield C{(name, key path, value node)} for each entry of the C{queues:} or
    C{aliases:} mapping C{node} whose name is a legal queue name; note a
    problem (C{bad <what> name}) for each other entry. A null section is empty.
    """
    if _is_null(node):
        return
    for name, key_node, value_node in walker.entries(node, section):
        path = _join(section, name)
        try:
            validate_queue_name(name)
        except InvalidQueueName as e:
            walker.problems.add(key_node, path, f"bad {what} name: {e}")
            continue
        yield name, path, value_node


def _build_queues(walker: _Walker, node: yaml.Node) -> dict[str, QueueOverride]:
    """The C{queues:} section: queue name -> its explicitly set keys."""
    return {name: QueueOverride(walker.queue_settings(value_node, path))
            for name, path, value_node in _named_entries(walker, node, "queues", "queue")}


def _build_aliases(walker: _Walker, node: yaml.Node) -> dict[str, tuple[str, ...]]:
    """The C{aliases:} section: alias name -> destination queue names (a non-empty list)."""
    aliases: dict[str, tuple[str, ...]] = {}
    for name, path, value_node in _named_entries(walker, node, "aliases", "alias"):
        if not isinstance(value_node, yaml.SequenceNode) or not value_node.value:
            walker.problems.add(value_node, path,
                                "expected a non-empty list of destination queue names")
            continue
        destinations: list[str] = []
        for i, item in enumerate(value_node.value):
            ok, destination = walker.scalar(item, f"{path}[{i}]", _queue_name)
            if ok:
                destinations.append(destination)
        if len(destinations) == len(value_node.value):
            aliases[name] = tuple(destinations)
    return aliases


def _check_server(config: ServerConfig, problems: _Problems, lines: Mapping[str, int]) -> None:
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
                problems.add(lines.get(_join("aliases", name)), _join("aliases", name),
                             f"destination {destination!r} is an alias; an alias writes "
                             "only to queues, and a queue of that name could not be read")


def _warnings(config: ServerConfig) -> tuple[str, ...]:
    """Non-fatal remarks on a valid config."""
    warnings: list[str] = []
    masked = sorted(set(config.queues) & set(config.aliases))
    if masked:
        warnings.append(f"queue name(s) masked by alias(es): {', '.join(masked)}")
    for path, queue in [("default", config.default)] + [
        (_join("queues", name), config.queue_config(name)) for name in sorted(config.queues)
    ]:
        if queue.durable_acks and queue.sync_journal is None and queue.keep_journal:
            warnings.append(f"{path}: durable_acks has no effect with sync_journal: never "
                            "(writes are acknowledged without waiting for an fsync)")
    return tuple(warnings)


def load_config(path: str | os.PathLike[str]) -> ServerConfig:
    """
    Read the YAML config file at C{path} and parse it with L{parse_config}.

    Raises L{ConfigError} for an unreadable file as for a bad one. Relative
    paths inside the file are relative to the server's working directory,
    not to the file.
    """
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"{source}: cannot read config file: {e}"]) from e
    return parse_config(text, source=source)


# -- dump_config -----------------------------------------------------------------------------


def format_queue_setting(key: str, value: Any) -> str:
    """
    Render one resolved queue setting in config-file notation.

    Sizes and counts are plain integers (bytes), durations carry a unit
    (C{60s}, C{250ms}), C{sync_journal} is C{never}, C{always} or a period,
    booleans are C{true}/C{false}, and "none"/"unlimited" is C{null}. Every
    rendered value parses back to the same setting. The rendering is the
    field's L{QueueKey.render}.
    """
    field = attrs.fields_dict(QueueConfig).get(key)
    render = _render_value if field is None else field.metadata[_KEY].render
    return render(value)


def dump_queue_config(config: QueueConfig) -> list[str]:
    """
    Return the C{key=value} lines of a resolved queue config, in field order.

    Values use L{format_queue_setting}. This is the body of C{dump_config}
    for one queue (see C{docs/config.md} for the framing).
    """
    return [f"{f.name}={format_queue_setting(f.name, getattr(config, f.name))}"
            for f in attrs.fields(QueueConfig)]


def parse_queue_setting(key: str, text: str) -> Any:
    """
    Parse one queue setting written as in a config file (the inverse of
    L{format_queue_setting}); raise L{ConfigError} if it is unknown or bad.
    """
    parser = _QUEUE_KEYS.get(key)
    if parser is None:
        raise ConfigError([f"{key}: unknown queue setting"])
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError([f"{key}: bad value {text!r}: {e}"]) from e
    try:
        return parser(value)
    except _BadValueError as e:
        raise ConfigError([f"{key}: {e}"]) from e
