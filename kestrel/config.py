"""
Configuration: the YAML schema, its defaults, and per-queue resolution.

(Skeleton: the value classes are fixed here; parsing is being built.)
"""

from __future__ import annotations

import attrs

#: Sync policy: None = never fsync on write, 0.0 = fsync every write, > 0 = period in seconds.
SyncPolicy = float | None


@attrs.frozen
class QueueConfig:
    """
    The resolved settings of one queue. Every field has Kestrel's built-in default.

    Durations are float seconds (or None), sizes are bytes, and a limit of
    None means unlimited.
    """

    max_items: int | None = None
    max_size: int | None = None
    max_item_size: int | None = None
    max_age: float | None = None
    default_journal_size: int = 16 * 1024 * 1024
    max_memory_size: int = 128 * 1024 * 1024
    max_journal_size: int = 1024 * 1024 * 1024
    min_journal_compact_delay: float | None = 60.0
    discard_old_when_full: bool = False
    keep_journal: bool = True
    sync_journal: SyncPolicy = None
    durable_acks: bool = False
    expire_to_queue: str | None = None
    max_expire_sweep: int | None = None
    fanout_only: bool = False
    max_queue_age: float | None = None
    open_transaction_timeout: float | None = None
    disable_aggressive_rewrites: bool = False
