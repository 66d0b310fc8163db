"""
WriteCoalescer: the write batch of a pass over a connection's input.

While a batch is open, the journal files that share a coalescer hold their
writes back in memory; the batch's flush hands each file's bytes to the OS
in one C{os.write}. Files register themselves with L{WriteCoalescer.hold};
the coalescer knows nothing else of them (see L{HeldFile}).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class HeldFile(Protocol):
    """A file holding back bytes for a coalescer's flush."""

    def flush(self) -> bool:
        """Write the held-back bytes to the OS now; return whether they got there."""
        ...


class WriteCoalescer:
    """
    Holds back the writes made during a batch, so that each file gets one C{os.write}.

    Outside a batch (L{begin} .. L{end}) the files that share a coalescer
    write at once, as without one. Inside, their bytes wait in memory until
    L{flush} or the end of the outermost batch. Whoever opens a batch must
    call L{flush} before it lets anything depend on those writes (before a
    reply to them is handed to a transport): only then are they in the OS,
    and only if L{batch_failed} is still false did they all get there.

    A batch holds only the records of the connection that opened it:
    whatever would serve another connection from inside it (waking a
    blocked reader, answering one) waits in L{after_flush} until the held
    bytes are in the OS, and then runs outside the batch, where its own
    records are written on their own.
    """

    __slots__ = ("depth", "_dirty", "_failed", "_after")

    def __init__(self) -> None:
        #: How many batches are open (nested); 0: writes go straight through.
        #: Read it, never set it (L{begin} and L{end} do).
        self.depth = 0
        #: Files holding back bytes, in the order they first did.
        self._dirty: list[HeldFile] = []
        # Whether the OS refused a held-back write of the open batch.
        self._failed = False
        # Calls waiting for the batch's flush (see after_flush), in order.
        self._after: list[tuple[Callable[..., object], tuple[Any, ...]]] = []

    @property
    def active(self) -> bool:
        """Whether a batch is open: writes are held back."""
        return self.depth > 0

    @property
    def batch_failed(self) -> bool:
        """
        Whether the OS refused a held-back write of the open batch (always
        false outside a batch): what was acknowledged in it may not be journaled.
        """
        return self._failed and self.depth > 0

    def begin(self) -> None:
        """Open a batch (batches nest; only the outermost L{end} flushes)."""
        if not self.depth:
            self._failed = False
        self.depth += 1

    def end(self) -> bool:
        """Close a batch; the outermost one flushes. Returns what L{flush} returned."""
        self.depth -= 1
        if self.depth > 0:
            return True
        self.depth = 0
        return self.flush() if self._dirty or self._after else True

    @property
    def holding(self) -> bool:
        """Whether some file holds back bytes that L{flush} would write."""
        return bool(self._dirty)

    def flush(self) -> bool:
        """
        Write every held-back byte to the OS now (one C{os.write} per file),
        then run the calls that waited for it (L{after_flush}).

        Returns false if a file refused its bytes: that file was cut back to
        where it stood before them, the failure was logged and reported
        (C{on_error}) before any waiting call runs, and the Deferreds of the
        writes that were waiting to be made durable failed.
        """
        ok = True
        # Whatever a flush sets off (an inline fsync firing acknowledgements,
        # the waiting calls) runs outside the batch, so that its own writes
        # are not held back.
        depth, self.depth = self.depth, 0
        failed = self._failed
        try:
            while self._dirty:
                dirty, self._dirty = self._dirty, []
                for sync_file in dirty:
                    if not sync_file.flush():
                        ok = False
            while self._after:
                after, self._after = self._after, []
                for f, args in after:
                    f(*args)
        finally:
            self.depth = depth
            self._failed = failed or not ok
        return ok

    def flush_batch(self) -> bool:
        """
        L{flush} what is held back, then return whether every held-back
        write of the open batch reached the OS (true outside a batch): the
        check a protocol makes before it sends the batch's replies.
        """
        if self._dirty or self._after:
            self.flush()
        return not (self._failed and self.depth)

    def after_flush(self, f: Callable[..., object], *args: Any) -> None:
        """
        Call C{f(*args)} outside any batch once every byte held back so far is in the OS.

        Outside a batch that is now: C{f} is called at once. Inside, C{f}
        waits for the batch's next L{flush} and runs after the files wrote
        (or refused) their bytes, with the batch set aside: the writes C{f}
        makes go straight through, so that they are its own, not the batch's.
        """
        if not self.depth:
            f(*args)
            return
        self._after.append((f, args))

    def hold(self, sync_file: HeldFile) -> None:
        """C{sync_file} holds back bytes for the next L{flush} (called once per flush)."""
        self._dirty.append(sync_file)

    def held_write_failed(self) -> None:
        """A file's flush of held-back bytes failed: the open batch failed."""
        self._failed = True
