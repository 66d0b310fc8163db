"""
ReadBehind: a queue whose items outgrow memory keeps the rest in its journal.

Past C{max_memory_size} payload bytes, new items are only journaled; as
the queue empties, they are read back in journal order (Kestrel's
read-behind). Reading back past a rotation's checkpoint packs the files
before it (see docs/journal.md, "Read-behind and packing").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from kestrel.config import QueueConfig
from kestrel.item import QItem
from kestrel.journal.interface import IJournal
from kestrel.queue_observer import QueueObserver

if TYPE_CHECKING:
    from kestrel.journal.pack import Checkpoint


class ReadBehindHost(Protocol):
    """What L{ReadBehind} reads of its queue, and how it hands items back."""

    name: str
    journal: IJournal
    observer: QueueObserver | None
    bytes: int
    memory_bytes: int

    #: Whether adds are acknowledged (and seen) only once fsynced (L{kestrel.queue}).
    acks_durably: bool

    @property
    def unsynced_count(self) -> int:
        """How many items memory holds unseen until their fsync (L{kestrel.unsynced})."""
        ...

    @property
    def config(self) -> QueueConfig:
        """The queue's settings now."""
        ...

    @property
    def xid_counter(self) -> int:
        """The last xid handed out (a pack saves it)."""
        ...

    def memory_items(self) -> Sequence[QItem]:
        """The queued items held in memory, head first."""
        ...

    def open_items(self) -> list[QItem]:
        """The open reads' items."""
        ...

    def read_back(self, item: QItem) -> None:
        """Append C{item}, read back from the journal, to memory."""
        ...


class ReadBehind:
    """
    Moves one queue into and out of read-behind.

    Promises: memory always holds at least the head item while the queue
    has items (even with C{max_memory_size} 0), and items come back in the
    order they were added. Under a durable policy (C{durable_acks}, or
    C{sync_journal: always}) no item comes back before the fsync covering
    its record succeeded, nor while items held unseen for their fsync
    (older than any on disk only) are in memory: the queue fills again
    once they are shown.
    """

    _log = Logger()

    def __init__(self, host: ReadBehindHost, clock: IReactorTime) -> None:
        self._host = host
        self._clock = clock

    def start_if_full(self, keep_head: bool = True) -> None:
        """
        Keep further adds on disk only, once memory holds C{max_memory_size}
        bytes (and, with C{keep_head}, at least one item to hand out).
        """
        host = self._host
        journal = host.journal
        if (not journal.in_read_behind and host.bytes >= host.config.max_memory_size
                and (host.memory_items() or not keep_head)):
            self._log.info("Dropping to read-behind for {queue} ({bytes} bytes)",
                           queue=host.name, bytes=host.bytes)
            journal.start_read_behind()

    def fill(self) -> None:
        """Read items back from the journal until memory is full or the reader catches up."""
        host = self._host
        journal = host.journal
        limit = host.config.max_memory_size
        if (not journal.in_read_behind or (host.memory_bytes >= limit and host.memory_items())
                or host.unsynced_count):
            return
        durable_only = host.acks_durably
        observer = host.observer
        started = self._clock.seconds() if observer is not None else 0.0
        while journal.in_read_behind and (host.memory_bytes < limit or not host.memory_items()):
            if not journal.fill_read_behind(host.read_back, self._passed_checkpoint,
                                            durable_only):
                break  # (the rest is not durable yet)
            if not journal.in_read_behind:
                self._log.info("Coming out of read-behind for {queue}", queue=host.name)
        if observer is not None:
            observer.read_behind_filled(self._clock.seconds() - started)

    def _passed_checkpoint(self, checkpoint: Checkpoint) -> None:
        host = self._host
        self._log.info("Packing journal of {queue} from checkpoint", queue=host.name)
        host.journal.start_pack(checkpoint, host.open_items()[::-1],
                                list(host.memory_items()), xid_counter=host.xid_counter)
