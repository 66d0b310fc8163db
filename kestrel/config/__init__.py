"""
Configuration: the YAML schema, its defaults, and per-queue resolution.

C{docs/config.md} documents every key of the schema. L{parse_config} is pure
(no I/O): it checks the whole file and raises one L{ConfigError} listing every
problem, each naming its dotted key path and line. L{load_config} reads a file
and parses it.

Per-queue settings resolve as Kestrel 2.4 does: built-in defaults, then the
C{default:} section, then the queue's own entry under C{queues:}, then, for a
fanout child C{q+f}, the child's entry on top of its master C{q}'s resolved
settings.

The package: L{kestrel.config.values} (how each kind of value is parsed and
rendered), L{kestrel.config.schema} (every key declared once, with its
default, parser and docs row), L{kestrel.config.parse} (the YAML walk),
L{kestrel.config.dump} (C{dump_config}'s notation) and
L{kestrel.config.problems} (error collection). Import from here.
"""

from kestrel.config.dump import dump_queue_config, format_queue_setting, parse_queue_setting
from kestrel.config.parse import load_config, parse_config
from kestrel.config.schema import (
    DEFAULT_CONFIG,
    DEFAULT_STATUS_FILE,
    QueueConfig,
    QueueKey,
    QueueOverride,
    ServerConfig,
    ServerKey,
    ZooKeeperConfig,
    default_status_file,
    queue_key,
    queue_keys_table,
    server_key,
    server_keys_table,
    zookeeper_keys_table,
)
from kestrel.config.values import SyncPolicy, parse_duration, parse_size, parse_sync_policy

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_STATUS_FILE",
    "QueueConfig",
    "QueueKey",
    "QueueOverride",
    "ServerConfig",
    "ServerKey",
    "SyncPolicy",
    "ZooKeeperConfig",
    "default_status_file",
    "dump_queue_config",
    "format_queue_setting",
    "load_config",
    "parse_config",
    "parse_duration",
    "parse_queue_setting",
    "parse_size",
    "parse_sync_policy",
    "queue_key",
    "queue_keys_table",
    "server_key",
    "server_keys_table",
    "zookeeper_keys_table",
]
