"""The YAML config schema, its checks, per-queue resolution and dump_config (kestrel.config)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from twisted.logger import capturedLogs

from kestrel.config import (
    DEFAULT_CONFIG,
    QueueConfig,
    QueueOverride,
    ServerConfig,
    ZooKeeperConfig,
    dump_queue_config,
    format_queue_setting,
    load_config,
    parse_config,
    parse_duration,
    parse_queue_setting,
    parse_size,
    parse_sync_policy,
)
from kestrel.errors import ConfigError
from kestrel.status import Status

ROOT = Path(__file__).resolve().parents[2]

KiB, MiB, GiB = 1024, 1024 ** 2, 1024 ** 3

#: The `default:` keys of docs/config.md, in its order.
INTERFACE_QUEUE_KEYS = [
    "max_items", "max_size", "max_item_size", "max_age", "default_journal_size",
    "max_memory_size", "max_journal_size", "min_journal_compact_delay", "discard_old_when_full",
    "keep_journal", "sync_journal", "durable_acks", "expire_to_queue", "max_expire_sweep",
    "fanout_only", "max_queue_age", "open_transaction_timeout", "disable_aggressive_rewrites",
]


def problems_of(text: str, source: str = "k.yaml") -> list[str]:
    """The problems parse_config reports for text (fails if it reports none)."""
    with pytest.raises(ConfigError) as e:
        parse_config(text, source)
    assert str(e.value) == "; ".join(e.value.problems)
    return e.value.problems


# -- defaults and the shipped file -----------------------------------------------------------


def test_built_in_defaults() -> None:
    """Without a file the server runs on the documented defaults (docs/config.md)."""
    c = DEFAULT_CONFIG
    assert (c.listen_address, c.memcache_port, c.text_port, c.thrift_port, c.admin_port) == (
        "127.0.0.1", 22133, 2222, 2229, 2223)
    assert (c.queue_path, c.archive_path, c.status_file) == (
        "./kestrel-data", None, "./kestrel-status")
    assert c.default_status is Status.UP
    assert (c.status_change_grace_period, c.expiration_timer_frequency, c.client_timeout) == (
        0.0, 1.0, None)
    assert c.max_open_transactions == 1
    assert (c.connection_limit_refuse_writes, c.connection_limit_refuse_reads) == (None, None)
    assert c.max_request_size == 64 * MiB
    assert c.zookeeper is None
    assert c.default == QueueConfig()
    assert dict(c.queues) == {} and dict(c.aliases) == {}


def test_queue_defaults_are_kestrels() -> None:
    """The built-in queue settings are Kestrel's QueueBuilder defaults."""
    q = QueueConfig()
    assert (q.max_items, q.max_size, q.max_item_size, q.max_age) == (None, None, None, None)
    assert (q.default_journal_size, q.max_memory_size, q.max_journal_size) == (
        16 * MiB, 128 * MiB, GiB)
    assert q.min_journal_compact_delay == 60.0
    assert q.keep_journal and not q.discard_old_when_full and not q.fanout_only
    assert q.sync_journal is None and not q.durable_acks


def test_queue_config_fields_are_the_interface_keys() -> None:
    """QueueConfig has exactly the documented `default:` keys."""
    assert [f.name for f in attrs.fields(QueueConfig)] == INTERFACE_QUEUE_KEYS


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "---\n", "null\n", "{}\n"])
def test_empty_document_gives_defaults(text: str) -> None:
    """Every key is optional: an empty file is the built-in defaults."""
    assert parse_config(text) == DEFAULT_CONFIG


def test_shipped_config_is_defaults_with_100_open_transactions() -> None:
    """etc/kestrel.yaml spells out the defaults, except max_open_transactions: 100."""
    loaded = load_config(ROOT / "etc" / "kestrel.yaml")
    assert loaded == attrs.evolve(DEFAULT_CONFIG, max_open_transactions=100)
    assert loaded.warnings == ()


def test_shipped_config_mentions_every_key() -> None:
    """The shipped file documents every key explicitly (none left to the defaults)."""
    text = (ROOT / "etc" / "kestrel.yaml").read_text()
    server_keys = [f.name for f in attrs.fields(ServerConfig) if f.name != "warnings"]
    for key in server_keys:
        assert f"\n{key}:" in text, key
    for key in INTERFACE_QUEUE_KEYS:
        assert f"\n  {key}:" in text, key


INTERFACE_EXAMPLE = """\
listen_address: 127.0.0.1      # built-in default; Kestrel's was 0.0.0.0
memcache_port: 22133           # 0 or null: disabled
text_port: 2222
thrift_port: 2229
admin_port: 2223
queue_path: ./kestrel-data     # created if missing
archive_path: null             # dead journal files moved here instead of deleted
status_file: ./kestrel-status  # never inside queue_path
default_status: up             # up | readonly | quiescent | writeavoid
status_change_grace_period: 0s
expiration_timer_frequency: 1s
client_timeout: null
max_open_transactions: 1       # per queue per connection, as Kestrel's code
connection_limit_refuse_writes: null
connection_limit_refuse_reads: null
max_request_size: 64MiB        # largest memcache/text line or thrift frame
zookeeper: null                # or {host, port: 2181, path_prefix, session_timeout: 10s}
default:                       # every queue inherits these
  max_items: null              # null: unlimited
  max_size: null
  max_item_size: null
  max_age: null
  default_journal_size: 16MiB
  max_memory_size: 128MiB
  max_journal_size: 1GiB
  min_journal_compact_delay: 1m
  discard_old_when_full: false
  keep_journal: true
  sync_journal: never          # never | always | a duration (fsync period)
  durable_acks: false          # true: reply to a write only after its fsync
  expire_to_queue: null
  max_expire_sweep: null
  fanout_only: false
  max_queue_age: null
  open_transaction_timeout: null
  disable_aggressive_rewrites: false
queues:                        # per-queue overrides; fanout children as "parent+child"
  weather_updates: {max_age: 1800s, max_items: 1500000}
aliases:
  wx_updates: [weather_updates]
"""


def test_interface_example_parses() -> None:
    """The documented example config is valid and means what it says."""
    c = parse_config(INTERFACE_EXAMPLE)
    assert attrs.evolve(c, queues={}, aliases={}) == DEFAULT_CONFIG
    weather = c.queue_config("weather_updates")
    assert weather == attrs.evolve(QueueConfig(), max_age=1800.0, max_items=1_500_000)
    assert c.queues["weather_updates"] == QueueOverride({"max_age": 1800.0,
                                                          "max_items": 1_500_000})
    assert dict(c.aliases) == {"wx_updates": ("weather_updates",)}
    assert c.warnings == ()


# -- inheritance -----------------------------------------------------------------------------


GUIDE_EXAMPLE = """
default:
  max_memory_size: 8MiB
queues:
  q: {max_items: 500}
  q+fanout: {max_age: 1m}
  x: {max_memory_size: 16MiB}
"""


def test_guide_inheritance_example() -> None:
    """Reference 5.3: default -> queue -> fanout child, each level over the one before."""
    c = parse_config(GUIDE_EXAMPLE)
    assert c.queue_config("q").max_memory_size == 8 * MiB
    assert c.queue_config("q").max_items == 500
    child = c.queue_config("q+fanout")
    assert (child.max_memory_size, child.max_items, child.max_age) == (8 * MiB, 500, 60.0)
    assert c.queue_config("q").max_age is None
    assert c.queue_config("x").max_memory_size == 16 * MiB
    assert c.queue_config("x").max_items is None
    # an unconfigured queue gets the default; an unconfigured child gets its master's
    assert c.queue_config("other") == c.default
    assert c.queue_config("q+other") == c.queue_config("q")
    # the master is the text before the first '+'
    assert c.queue_config("q+fanout+deeper") == c.queue_config("q")


def test_reload_example_from_serverspec() -> None:
    """A queue no longer named in the file falls back to the new default."""
    old = parse_config("queues: {weather_updates: {max_items: 1500000}, starship: {}}")
    new = parse_config("default: {max_items: 9999}\nqueues: {starship: {max_items: 50}}")
    assert old.queue_config("weather_updates").max_items == 1_500_000
    assert new.queue_config("starship").max_items == 50
    assert new.queue_config("weather_updates").max_items == 9999


def test_explicit_null_overrides_a_parent_value() -> None:
    """Setting a key to null at a more specific level is a setting too (Kestrel's 'specified')."""
    c = parse_config("default: {max_items: 10, max_age: 5s}\nqueues: {q: {max_items: null}}")
    assert c.queue_config("q").max_items is None
    assert c.queue_config("q").max_age == 5.0
    assert c.queue_config("p").max_items == 10


def test_empty_queue_entry_inherits_everything() -> None:
    """`q:` with no body, or `{}`, is a configured queue with no overrides."""
    c = parse_config("default: {max_items: 3}\nqueues:\n  q:\n  r: {}\n")
    assert c.queue_config("q") == c.queue_config("r") == c.default
    assert set(c.queues) == {"q", "r"}


def test_yaml_merge_keys_are_supported() -> None:
    """YAML merge keys let queues share settings; explicit keys win over merged ones."""
    c = parse_config("""
queues:
  base: &common {max_items: 7, max_age: 1h}
  q:
    <<: *common
    max_items: 9
""")
    assert c.queue_config("q").max_items == 9
    assert c.queue_config("q").max_age == 3600.0


QUEUE_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "max_items": st.none() | st.integers(0, 2 ** 40),
    "max_size": st.none() | st.integers(0, 2 ** 50),
    "max_item_size": st.none() | st.integers(0, 2 ** 50),
    "max_age": st.none() | st.floats(0, 1e9),
    "default_journal_size": st.integers(0, 2 ** 50),
    "max_memory_size": st.integers(0, 2 ** 50),
    "max_journal_size": st.integers(0, 2 ** 50),
    "min_journal_compact_delay": st.none() | st.floats(0, 1e9),
    "discard_old_when_full": st.booleans(),
    "keep_journal": st.booleans(),
    "sync_journal": st.none() | st.just(0.0) | st.floats(0, 1e6),
    "durable_acks": st.booleans(),
    "expire_to_queue": st.none() | st.sampled_from(["dead", "no", "null", "123", "x+y", "q"]),
    "max_expire_sweep": st.none() | st.integers(0, 2 ** 31),
    "fanout_only": st.booleans(),
    "max_queue_age": st.none() | st.floats(0, 1e9),
    "open_transaction_timeout": st.none() | st.floats(0, 1e9),
    "disable_aggressive_rewrites": st.booleans(),
}


def test_queue_value_strategies_cover_every_key() -> None:
    """The property tests below exercise every queue key."""
    assert list(QUEUE_VALUES) == INTERFACE_QUEUE_KEYS


def queue_settings() -> st.SearchStrategy[dict[str, Any]]:
    """Some queue keys with valid values."""
    return st.dictionaries(st.sampled_from(INTERFACE_QUEUE_KEYS), st.none(), max_size=8).flatmap(
        lambda keys: st.fixed_dictionaries({k: QUEUE_VALUES[k] for k in keys}))


def as_yaml_block(settings: dict[str, Any], indent: str) -> str:
    """Queue settings as YAML lines, rendered as dump_config renders them."""
    if not settings:
        return " {}\n"
    return "\n" + "".join(f"{indent}{k}: {format_queue_setting(k, v)}\n"
                          for k, v in settings.items())


@given(queue_settings(), queue_settings(), queue_settings())
def test_the_most_specific_level_always_wins(default: dict[str, Any], master: dict[str, Any],
                                             child: dict[str, Any]) -> None:
    """
    For every key: the fanout child's setting if it has one, else the master's,
    else the default section's, else the built-in default.
    """
    text = ("default:" + as_yaml_block(default, "  ")
            + "queues:\n  m:" + as_yaml_block(master, "    ")
            + "  m+c:" + as_yaml_block(child, "    "))
    c = parse_config(text)
    builtin = QueueConfig()
    for key in INTERFACE_QUEUE_KEYS:
        for level in (child, master, default):
            if key in level:
                expected = level[key]
                break
        else:
            expected = getattr(builtin, key)
        assert getattr(c.queue_config("m+c"), key) == expected, key
        master_expected = master.get(key, default.get(key, getattr(builtin, key)))
        assert getattr(c.queue_config("m"), key) == master_expected, key
        assert getattr(c.queue_config("other+c"), key) == default.get(key, getattr(builtin, key))


@given(queue_settings(), queue_settings())
def test_override_apply_matches_evolve(parent: dict[str, Any], own: dict[str, Any]) -> None:
    """QueueOverride.apply replaces exactly the keys it sets."""
    base = attrs.evolve(QueueConfig(), **parent)
    assert QueueOverride(own).apply(base) == attrs.evolve(base, **own)


def test_queue_override_refuses_unknown_keys() -> None:
    """A programming error in an override is caught at construction."""
    with pytest.raises(ValueError, match="colour"):
        QueueOverride({"colour": "blue"})


# -- sizes and durations ---------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    (0, 0), (1234, 1234), ("1234", 1234), ("512B", 512), ("512 bytes", 512), ("1KiB", KiB),
    ("1KB", KiB), ("16MiB", 16 * MiB), ("16MB", 16 * MiB), ("16mib", 16 * MiB),
    ("1GiB", GiB), ("1GB", GiB), ("1.5KiB", 1536), (" 2 MiB ", 2 * MiB), ("1e3", 1000),
])
def test_sizes(text: object, expected: int) -> None:
    """Sizes are bytes, or a number with a binary unit (KB means KiB, as in Kestrel)."""
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", [-1, "-1KiB", "1TiB", "1.5B", "MiB", "", "1 2MiB", True, 1.5,
                                  [1], None, "0x10"])
def test_bad_sizes(text: object) -> None:
    """Negative, fractional-byte, unitless-garbage or non-size values are refused."""
    with pytest.raises(ValueError):
        parse_size(text)


SIZE_UNITS = {"B": 1, "bytes": 1, "KiB": KiB, "KB": KiB, "MiB": MiB, "MB": MiB, "GiB": GiB,
              "GB": GiB}


@given(st.integers(0, 2 ** 40), st.sampled_from(sorted(SIZE_UNITS)), st.booleans(),
       st.sampled_from(["", " "]))
def test_size_units_multiply(n: int, unit: str, lower: bool, space: str) -> None:
    """n<unit> is n times the unit's power of 1024, whatever the unit's case."""
    text = f"{n}{space}{unit.lower() if lower else unit}"
    assert parse_size(text) == n * SIZE_UNITS[unit]


@given(st.integers(0, 2 ** 62))
def test_integer_sizes_are_bytes(n: int) -> None:
    """A bare integer is that many bytes; negative integers are refused."""
    assert parse_size(n) == n
    assert parse_size(str(n)) == n
    if n:
        with pytest.raises(ValueError, match="negative"):
            parse_size(-n)


@pytest.mark.parametrize("text, expected", [
    (0, 0.0), (30, 30.0), (1.5, 1.5), ("250ms", 0.25), ("30s", 30.0), ("5m", 300.0),
    ("1h", 3600.0), ("1d", 86400.0), ("1.5h", 5400.0), ("30", 30.0), (" 30 s", 30.0),
    ("0s", 0.0),
])
def test_durations(text: object, expected: float) -> None:
    """Durations take ms, s, m, h, d; a bare number is seconds."""
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", [-1, "-5s", "5M", "5 minutes", "5S", "s", True, math.inf,
                                  math.nan, "inf", [5], None])
def test_bad_durations(text: object) -> None:
    """Negative, infinite, unknown-unit (units are case-sensitive) or non-numbers are refused."""
    with pytest.raises(ValueError):
        parse_duration(text)


DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


@given(st.integers(0, 10 ** 9), st.sampled_from(sorted(DURATION_UNITS)))
def test_duration_units_multiply(n: int, unit: str) -> None:
    """n<unit> is n times the unit in seconds."""
    assert parse_duration(f"{n}{unit}") == pytest.approx(n * DURATION_UNITS[unit], rel=1e-12)


@given(st.floats(0, 1e12))
def test_bare_numbers_are_seconds(x: float) -> None:
    """A bare non-negative number is that many seconds."""
    assert parse_duration(x) == x


@pytest.mark.parametrize("text, expected", [
    ("never", None), (None, None), ("always", 0.0), ("ALWAYS", 0.0), (0, 0.0), ("0ms", 0.0),
    ("100ms", 0.1), ("1s", 1.0), (2, 2.0),
])
def test_sync_policies(text: object, expected: float | None) -> None:
    """never -> None, always -> 0.0, a duration -> its period in seconds."""
    assert parse_sync_policy(text) == expected


def test_bad_sync_policy() -> None:
    """Anything else is refused, naming the three forms."""
    with pytest.raises(ValueError, match="never, always or a duration"):
        parse_sync_policy("sometimes")


# -- the YAML schema -------------------------------------------------------------------------


def test_server_values_are_converted() -> None:
    """Ports 0/null disable a listener; sizes, durations and status names convert."""
    c = parse_config("""
listen_address: 0.0.0.0
memcache_port: 0
text_port: null
thrift_port: 12229
admin_port: 0
queue_path: /var/spool/kestrel
archive_path: /var/spool/kestrel-archive
status_file: /var/run/kestrel/status
default_status: ReadOnly
status_change_grace_period: 30s
expiration_timer_frequency: null
client_timeout: 5m
max_open_transactions: 100
connection_limit_refuse_writes: 500
connection_limit_refuse_reads: 1000
max_request_size: 1MiB
zookeeper: {host: zk1, path_prefix: /kestrel/production}
""")
    assert (c.memcache_port, c.text_port, c.thrift_port, c.admin_port) == (None, None, 12229, None)
    assert c.listen_address == "0.0.0.0"
    assert c.archive_path == "/var/spool/kestrel-archive"
    assert c.default_status is Status.READ_ONLY
    assert c.status_change_grace_period == 30.0
    assert c.expiration_timer_frequency is None
    assert c.client_timeout == 300.0
    assert (c.connection_limit_refuse_writes, c.connection_limit_refuse_reads) == (500, 1000)
    assert c.max_request_size == MiB
    assert c.zookeeper == ZooKeeperConfig(host="zk1", path_prefix="/kestrel/production",
                                          port=2181, session_timeout=10.0)


def test_status_file_may_be_null() -> None:
    """status_file: null keeps the status in memory only."""
    assert parse_config("status_file: null").status_file is None


def test_grace_period_null_is_zero() -> None:
    """A null grace period means none."""
    assert parse_config("status_change_grace_period: null").status_change_grace_period == 0.0


def test_zookeeper_with_every_key() -> None:
    """port and session_timeout may be set."""
    c = parse_config("zookeeper: {host: zk, port: 2182, path_prefix: /k, session_timeout: 3s}")
    assert c.zookeeper == ZooKeeperConfig("zk", "/k", 2182, 3.0)


def test_unknown_keys_are_named_with_their_line() -> None:
    """Unknown keys at every level are errors naming the dotted key and its line."""
    assert problems_of("""\
memcache_port: 1
colour: blue
default:
  max_itmes: 5
queues:
  weather:
    max_age: 1s
    fanciness: 3
zookeeper: {host: h, path_prefix: /p, acl: open}
""") == [
        "k.yaml:2: colour: unknown setting",
        "k.yaml:4: default.max_itmes: unknown queue setting",
        "k.yaml:8: queues.weather.fanciness: unknown queue setting",
        "k.yaml:9: zookeeper.acl: unknown zookeeper setting",
    ]


def test_every_problem_of_a_file_is_reported_at_once() -> None:
    """One ConfigError lists all problems, in line order, each with key path and line."""
    problems = problems_of("""\
memcache_port: 70000
text_port: yes
queue_path: /srv/q
status_file: /srv/q/status
default_status: down
max_request_size: 0
default:
  max_items: -1
  max_size: -3KiB
  sync_journal: sometimes
  keep_journal: 1
queues:
  weather:
    max_items: lots
    max_age: 5 parsecs
  "a/b": {}
  q: 5
  r: {expire_to_queue: "x.y"}
aliases:
  z: []
  y: [y]
  w: [ok, "bad name"]
zookeeper: {host: h, port: 0}
""")
    assert problems == [
        "k.yaml:1: memcache_port: a port must be between 0 and 65535, got 70000",
        "k.yaml:2: text_port: expected a port number (0 or null: disabled), got true",
        "k.yaml:4: status_file: must not be inside queue_path ('/srv/q/status' is in '/srv/q')",
        "k.yaml:5: default_status: down cannot be a default status "
        "(use up, readonly, quiescent or writeavoid)",
        "k.yaml:6: max_request_size: must be greater than zero, got 0",
        "k.yaml:8: default.max_items: cannot be negative, got -1",
        "k.yaml:9: default.max_size: a size cannot be negative, got '-3KiB'",
        "k.yaml:10: default.sync_journal: expected never, always or a duration (fsync period) "
        "like '100ms', got 'sometimes'",
        "k.yaml:11: default.keep_journal: expected true or false, got 1",
        "k.yaml:14: queues.weather.max_items: expected a whole number, got 'lots'",
        "k.yaml:15: queues.weather.max_age: expected a duration like '250ms', '30s', '5m', "
        "'1h', '1d' or seconds, got '5 parsecs'",
        "k.yaml:16: queues.a/b: bad queue name: "
        "Queue name contains illegal characters (one of: ~ . /).",
        "k.yaml:17: queues.q: expected a mapping, got '5'",
        "k.yaml:18: queues.r.expire_to_queue: "
        "Queue name contains illegal characters (one of: ~ . /).",
        "k.yaml:20: aliases.z: expected a non-empty list of destination queue names",
        "k.yaml:21: aliases.y: destination 'y' is an alias; an alias writes only to queues, "
        "and a queue of that name could not be read",
        "k.yaml:22: aliases.w[1]: Queue name contains whitespace (' ').",
        "k.yaml:23: zookeeper.port: a port must be between 1 and 65535, got 0",
        "k.yaml:23: zookeeper.path_prefix: required when zookeeper is set",
    ]


def test_config_error_is_a_value_error_with_problems() -> None:
    """ConfigError carries the list; its message joins them."""
    with pytest.raises(ValueError) as e:
        parse_config("colour: blue\nshape: round\n")
    assert isinstance(e.value, ConfigError)
    assert len(e.value.problems) == 2


def test_duplicate_keys_are_errors() -> None:
    """A key given twice in one mapping is reported (YAML would silently keep the last)."""
    assert problems_of("text_port: 1\ntext_port: 2\n") == ["k.yaml:2: text_port: duplicate key"]
    assert problems_of("queues:\n  q: {}\n  q: {max_items: 1}\n") == [
        "k.yaml:3: queues.q: duplicate key"]


def test_yaml_syntax_error_names_the_line() -> None:
    """Broken YAML is a ConfigError with the line of the problem."""
    problems = problems_of("default:\n  max_items: [1,\n  max_size: 2\n")
    assert len(problems) == 1
    assert problems[0].startswith("k.yaml:4: YAML syntax error:")


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_document_must_be_a_mapping(text: str) -> None:
    """A document that is not a mapping is refused."""
    assert "expected a mapping" in problems_of(text)[0]


def test_non_scalar_keys_are_refused() -> None:
    """Complex keys are not names."""
    assert problems_of("? [a, b]\n: 1\n") == ["k.yaml:1: keys must be plain names"]


def test_unsafe_yaml_tags_are_refused() -> None:
    """Only plain YAML is read: a Python object tag is a problem, never executed."""
    problems = problems_of("listen_address: !!python/object/apply:os.getcwd []\n")
    assert problems[0].startswith("k.yaml:1: listen_address: bad value")


@pytest.mark.parametrize("key, value", [
    ("max_items", "true"), ("max_items", "1.5"), ("max_expire_sweep", "-2"),
    ("default_journal_size", "null"), ("max_memory_size", "null"), ("max_journal_size", "-1"),
    ("max_age", "-1s"), ("open_transaction_timeout", "forever"), ("fanout_only", "'yes'"),
    ("durable_acks", "null"), ("expire_to_queue", "''"), ("max_item_size", "1.5B"),
])
def test_bad_queue_values(key: str, value: str) -> None:
    """Every queue key checks its value and names itself in the error."""
    problems = problems_of(f"default:\n  {key}: {value}\n")
    assert len(problems) == 1 and problems[0].startswith(f"k.yaml:2: default.{key}: ")


@pytest.mark.parametrize("key, value", [
    ("listen_address", "''"), ("listen_address", "null"), ("queue_path", "null"),
    ("expiration_timer_frequency", "0s"), ("client_timeout", "0"),
    ("max_open_transactions", "-1"), ("max_open_transactions", "null"),
    ("connection_limit_refuse_reads", "-5"), ("default_status", "sideways"),
    ("max_request_size", "null"), ("admin_port", "-1"), ("zookeeper", "5"),
    ("queues", "[a, b]"), ("aliases", "{a: b}"), ("default", "7"),
])
def test_bad_server_values(key: str, value: str) -> None:
    """Every server key checks its value and names itself in the error."""
    problems = problems_of(f"{key}: {value}\n")
    assert len(problems) == 1 and (problems[0].startswith(f"k.yaml:1: {key}")), problems


def test_default_status_is_case_insensitive() -> None:
    """default_status takes any case."""
    assert parse_config("default_status: WriteAvoid").default_status is Status.WRITE_AVOID
    assert parse_config("default_status: QUIESCENT").default_status is Status.QUIESCENT


def test_zookeeper_requires_host_and_absolute_prefix() -> None:
    """host and path_prefix are required; the prefix is an absolute ZooKeeper path."""
    assert problems_of("zookeeper: {path_prefix: /k}") == [
        "k.yaml:1: zookeeper.host: required when zookeeper is set"]
    assert problems_of("zookeeper: {host: h, path_prefix: k}") == [
        "k.yaml:1: zookeeper.path_prefix: must be an absolute ZooKeeper path starting with '/', "
        "got 'k'"]


@pytest.mark.parametrize("queue_path, status_file", [
    ("./kestrel-data", "./kestrel-data/status"),
    ("./kestrel-data", "kestrel-data/sub/../status"),
    ("data", "./data"),
    ("/srv/q/", "/srv/q/x"),
])
def test_status_file_inside_queue_path_is_refused(queue_path: str, status_file: str) -> None:
    """The status file never lives inside the queue directory (after normalising)."""
    problems = problems_of(f"queue_path: {queue_path}\nstatus_file: {status_file}\n")
    assert len(problems) == 1 and problems[0].startswith("k.yaml:2: status_file: must not be")


@pytest.mark.parametrize("queue_path, status_file", [
    ("./kestrel-data", "./kestrel-data-status"),
    ("/srv/q", "/srv/status"),
    ("/srv/q/sub", "/srv/q/status"),
])
def test_status_file_beside_queue_path_is_fine(queue_path: str, status_file: str) -> None:
    """A sibling whose name merely starts like the queue folder is not inside it."""
    assert parse_config(f"queue_path: {queue_path}\nstatus_file: {status_file}\n").status_file


def test_archive_path_must_differ_from_queue_path() -> None:
    """Archiving into the queue folder would resurrect dead journals."""
    assert problems_of("queue_path: /q\narchive_path: /q/\n") == [
        "k.yaml:2: archive_path: must not be the same folder as queue_path"]


def test_fanout_queue_names_and_aliases() -> None:
    """Fanout children may be configured; aliases map to tuples of destinations."""
    c = parse_config("queues: {q+f: {max_items: 2}}\naliases: {a: [q, r], b: [q+f]}\n")
    assert c.queue_config("q+f").max_items == 2
    assert dict(c.aliases) == {"a": ("q", "r"), "b": ("q+f",)}


def test_alias_destinations_must_not_be_aliases() -> None:
    """
    An alias writes only to plain queues, so a destination naming an alias
    (which would fill a queue hidden by that alias) is refused, cycles included.
    """
    assert problems_of("aliases:\n  a: [b]\n  b: [c, a]\n  c2: [c]\n") == [
        "k.yaml:2: aliases.a: destination 'b' is an alias; an alias writes only to queues, "
        "and a queue of that name could not be read",
        "k.yaml:3: aliases.b: destination 'a' is an alias; an alias writes only to queues, "
        "and a queue of that name could not be read",
    ]


def test_aliases_masking_queues_are_warned_sorted() -> None:
    """Kestrel's warning text, with the names sorted; it is logged and kept on the config."""
    with capturedLogs() as events:
        c = parse_config("queues: {zeta: {}, alpha: {}, q: {}}\n"
                         "aliases: {zeta: [q], alpha: [q]}\n", "k.yaml")
    assert c.warnings == ("queue name(s) masked by alias(es): alpha, zeta",)
    assert [e["warning"] for e in events if "warning" in e] == list(c.warnings)
    assert c == parse_config("queues: {zeta: {}, alpha: {}, q: {}}\n"
                             "aliases: {zeta: [q], alpha: [q]}\n")


def test_durable_acks_without_fsync_is_warned() -> None:
    """durable_acks with sync_journal: never waits for nothing: a warning says so."""
    c = parse_config("queues: {q: {durable_acks: true}, r: {durable_acks: true, "
                     "sync_journal: 10ms}}")
    assert c.warnings == ("queues.q: durable_acks has no effect with sync_journal: never "
                          "(writes are acknowledged without waiting for an fsync)",)


def test_server_config_is_frozen() -> None:
    """Configs are values: they cannot be changed in place."""
    c = parse_config("queues: {q: {max_items: 1}}\naliases: {a: [q]}")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        c.text_port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        c.queues["r"] = QueueOverride()  # type: ignore[index]
    with pytest.raises(TypeError):
        c.aliases["b"] = ("q",)  # type: ignore[index]


# -- load_config and overrides ---------------------------------------------------------------


def test_load_config_reads_a_file(tmp_path: Path) -> None:
    """load_config parses the file and names it in problems."""
    path = tmp_path / "k.yaml"
    path.write_text("text_port: 1\n")
    assert load_config(path).text_port == 1
    path.write_text("text_port: -1\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert e.value.problems == [f"{path}:1: text_port: a port must be between 0 and 65535, got -1"]


def test_load_config_missing_file(tmp_path: Path) -> None:
    """A missing file is a ConfigError naming it."""
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")


def test_with_overrides_converts_like_the_file() -> None:
    """Command-line overrides take file notation: 0 disables, strings convert."""
    c = DEFAULT_CONFIG.with_overrides(memcache_port="0", text_port=2300, queue_path="/srv/q",
                                      listen_address="0.0.0.0", max_request_size="1MiB",
                                      client_timeout="30s", default_status="readonly")
    assert (c.memcache_port, c.text_port, c.queue_path) == (None, 2300, "/srv/q")
    assert (c.listen_address, c.max_request_size, c.client_timeout) == ("0.0.0.0", MiB, 30.0)
    assert c.default_status is Status.READ_ONLY
    assert c.default == DEFAULT_CONFIG.default
    zk = ZooKeeperConfig("h", "/p")
    assert DEFAULT_CONFIG.with_overrides(zookeeper=zk).zookeeper == zk


def test_with_overrides_checks_everything() -> None:
    """Bad, unknown and conflicting overrides are all reported in one ConfigError."""
    with pytest.raises(ConfigError) as e:
        DEFAULT_CONFIG.with_overrides(thrift_port="x", queues={}, queue_path="./s",
                                      status_file="./s/status")
    assert e.value.problems == [
        "<overrides>: thrift_port: expected a port number (0 or null: disabled), got 'x'",
        "<overrides>: queues: not a server-level setting that can be overridden",
        "<overrides>: status_file: must not be inside queue_path ('./s/status' is in './s')",
    ]


# -- dump_config -----------------------------------------------------------------------------


def test_dump_of_the_default_queue() -> None:
    """dump_config lines: key=value in field order, in config-file notation."""
    assert dump_queue_config(QueueConfig()) == [
        "max_items=null", "max_size=null", "max_item_size=null", "max_age=null",
        "default_journal_size=16777216", "max_memory_size=134217728",
        "max_journal_size=1073741824", "min_journal_compact_delay=60s",
        "discard_old_when_full=false", "keep_journal=true", "sync_journal=never",
        "durable_acks=false", "expire_to_queue=null", "max_expire_sweep=null",
        "fanout_only=false", "max_queue_age=null", "open_transaction_timeout=null",
        "disable_aggressive_rewrites=false",
    ]


def test_dump_formats() -> None:
    """Durations carry units, sync policies read as in the file, odd names are quoted."""
    q = attrs.evolve(QueueConfig(), max_age=0.25, sync_journal=0.0, max_queue_age=5400.0,
                     open_transaction_timeout=1.5, expire_to_queue="no", max_items=7)
    lines = dict(line.split("=", 1) for line in dump_queue_config(q))
    assert lines["max_age"] == "250ms"
    assert lines["sync_journal"] == "always"
    assert lines["max_queue_age"] == "5400s"
    assert lines["open_transaction_timeout"] == "1.5s"
    assert lines["expire_to_queue"] == '"no"'
    assert lines["max_items"] == "7"
    assert format_queue_setting("sync_journal", 0.1) == "100ms"


@given(st.fixed_dictionaries(QUEUE_VALUES))
def test_dump_reads_back_to_the_same_config(values: dict[str, Any]) -> None:
    """Every dumped line parses back (as a setting, and inside a config file) to the same value."""
    q = QueueConfig(**values)
    lines = dump_queue_config(q)
    back = {}
    for line in lines:
        key, text = line.split("=", 1)
        back[key] = parse_queue_setting(key, text)
    assert QueueConfig(**back) == q
    text = "default:\n" + "".join(f"  {line.replace('=', ': ', 1)}\n" for line in lines)
    assert parse_config(text).default == q


def test_parse_queue_setting_errors() -> None:
    """Unknown keys and bad values raise ConfigError naming the key."""
    with pytest.raises(ConfigError, match="colour: unknown"):
        parse_queue_setting("colour", "1")
    with pytest.raises(ConfigError, match="max_items"):
        parse_queue_setting("max_items", "-4")


# -- robustness ------------------------------------------------------------------------------


@given(st.text(max_size=300))
def test_any_text_gives_a_config_or_a_config_error(text: str) -> None:
    """Whatever the file holds, parsing ends in a ServerConfig or a ConfigError, nothing else."""
    try:
        result = parse_config(text)
    except ConfigError as e:
        assert e.problems and all(p.startswith("<string>") for p in e.problems)
    else:
        assert isinstance(result, ServerConfig)


SCALARS = (st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats()
           | st.text(max_size=12))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
SERVER_KEYS = [f.name for f in attrs.fields(ServerConfig) if f.name != "warnings"]


@given(st.dictionaries(st.sampled_from(SERVER_KEYS + ["colour"]), VALUES, max_size=6),
       st.dictionaries(st.sampled_from(INTERFACE_QUEUE_KEYS), VALUES, max_size=6))
def test_any_values_under_known_keys_give_a_config_or_a_config_error(
        server: dict[str, Any], queue: dict[str, Any]) -> None:
    """Well-formed YAML with arbitrary values is either accepted or refused with a clear error."""
    document = dict(server)
    document["queues"] = {"q": queue}
    text = yaml.safe_dump(document)
    try:
        result = parse_config(text)
    except ConfigError as e:
        assert e.problems
        assert all(p.startswith("<string>:") for p in e.problems)
    else:
        assert isinstance(result, ServerConfig)
        result.queue_config("q+child")


def test_characters_yaml_refuses_are_a_config_error_with_line() -> None:
    """Control characters YAML forbids are reported with their line, not as a crash."""
    assert problems_of("text_port: 1\nqueue_path: a\x01b\n") == [
        "k.yaml:2: YAML syntax error: character '\\x01' is not allowed in YAML "
        "(special characters are not allowed)"]


def test_restart_required_changes_lists_server_level_keys_only() -> None:
    """A reload applies default, queues and aliases; other changed keys are listed."""
    old = parse_config("text_port: 1\nqueues: {q: {}}\n")
    new = parse_config("text_port: 2\nqueue_path: /elsewhere\ndefault: {max_items: 5}\n"
                       "aliases: {a: [q]}\n")
    assert old.restart_required_changes(new) == ["text_port", "queue_path"]
    assert old.restart_required_changes(old) == []
    assert old.restart_required_changes(attrs.evolve(old, queues={})) == []


# -- the default status file -----------------------------------------------------------------


def test_default_status_file_moves_out_of_queue_path(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """
    Without status_file, queue_path: . puts the status file beside the queue
    folder, not inside it; a queue_path elsewhere keeps ./kestrel-status.
    """
    monkeypatch.chdir(tmp_path)
    assert parse_config("queue_path: .").status_file == str(tmp_path) + ".kestrel-status"
    assert parse_config("queue_path: ./q").status_file == "./kestrel-status"
    assert DEFAULT_CONFIG.with_overrides(queue_path=".").status_file == (
        str(tmp_path) + ".kestrel-status")


def test_explicit_status_file_inside_dot_is_refused() -> None:
    """A status_file set explicitly inside queue_path: . is still refused."""
    with pytest.raises(ConfigError, match="status_file: must not be inside queue_path"):
        parse_config("queue_path: .\nstatus_file: ./kestrel-status\n")


# -- one declaration per queue key -----------------------------------------------------------


def test_docs_queue_keys_table_is_the_declaration() -> None:
    """docs/config.md's queue-keys table is exactly what the QueueConfig declaration renders."""
    from kestrel.config import queue_keys_table

    text = (ROOT / "docs" / "config.md").read_text()
    section = text.split("## Queue keys", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert rows == queue_keys_table()


def test_docs_built_in_column_parses_to_the_default() -> None:
    """Each key's built-in value as the docs show it parses to the field's default."""
    from kestrel.config import queue_key

    for f in attrs.fields(QueueConfig):
        shown = queue_key(f.name).shown.strip("`")
        assert parse_queue_setting(f.name, shown) == f.default, f.name


def test_parse_and_render_come_from_the_declaration() -> None:
    """parse_queue_setting and dump_config use each field's declared parser and renderer."""
    from kestrel.config import queue_key

    assert queue_key("sync_journal").render(None) == "never"
    assert format_queue_setting("sync_journal", 0.0) == "always"
    assert parse_queue_setting("max_items", "10") == queue_key("max_items").parse(10) == 10
    with pytest.raises(KeyError):
        queue_key("no_such_key")
    assert dump_queue_config(QueueConfig()) == [
        f"{f.name}={queue_key(f.name).render(f.default)}" for f in attrs.fields(QueueConfig)]


# -- one declaration per server and zookeeper key --------------------------------------------


def docs_table(heading: str) -> list[str]:
    """The table lines of the docs/config.md section under C{heading} (up to the next one)."""
    text = (ROOT / "docs" / "config.md").read_text()
    section = text.split(heading + "\n", 1)[1].split("\n#", 1)[0]
    return [line for line in section.splitlines() if line.startswith("|")]


def test_docs_server_keys_table_is_the_declaration() -> None:
    """docs/config.md's server-level table is exactly what the ServerConfig declaration renders."""
    from kestrel.config import server_keys_table

    assert docs_table("## Server-level keys") == server_keys_table()
    assert [row.split("`")[1] for row in server_keys_table()[2:]] == SERVER_KEYS


def test_docs_zookeeper_keys_table_is_the_declaration() -> None:
    """The zookeeper table is the ZooKeeperConfig declaration; the docs' example uses its keys."""
    from kestrel.config import zookeeper_keys_table

    assert docs_table("### `zookeeper`") == zookeeper_keys_table()
    text = (ROOT / "docs" / "config.md").read_text().split("### `zookeeper`", 1)[1]
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert set(yaml.safe_load(example)["zookeeper"]) == set(attrs.fields_dict(ZooKeeperConfig))
    assert parse_config(example).zookeeper == ZooKeeperConfig(
        host="zk.example.com", path_prefix="/kestrel/prod", advertise_host="10.0.0.5")


def test_docs_server_default_column_parses_to_the_default() -> None:
    """Each server key's default as the docs show it reads back as the built-in value."""
    from kestrel.config import server_key

    for name in SERVER_KEYS:
        shown = server_key(name).shown
        if name == "default":
            assert shown == "(built-ins)"
            continue
        document = f"{name}: {shown.strip('`')}\n"
        assert getattr(parse_config(document), name) == getattr(DEFAULT_CONFIG, name), name


def test_every_scalar_server_key_parses_in_the_file_and_on_the_command_line() -> None:
    """The file and with_overrides take one key's value through the same declared parser."""
    from kestrel.config import server_key

    scalars = [name for name in SERVER_KEYS if server_key(name).parse is not None]
    assert "zookeeper" not in scalars and "queues" not in scalars
    assert len(scalars) == len(SERVER_KEYS) - 4
    for name in scalars:
        with pytest.raises(ConfigError, match=f"^k.yaml:1: {name}: "):
            parse_config(f"{name}: [1]\n", "k.yaml")
        with pytest.raises(ConfigError, match=f"^<overrides>: {name}: "):
            DEFAULT_CONFIG.with_overrides(**{name: [1]})
    with pytest.raises(KeyError):
        server_key("warnings")
