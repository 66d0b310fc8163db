"""
Unsynced: the items of durable adds that no reader may see yet.

Under a durable policy (C{sync_journal: always}, or C{durable_acks}) an add
is acknowledged only once the fsync covering its record succeeded; if that
fsync fails the producer is refused, so the item must never have been
served. Until then the queue keeps the item here, after every item readers
may see; the add's callback shows it (and every older one, since an fsync
covers a prefix of the file) in record order. A failed fsync leaves the
items here until the journal-failure reload L{drop}s them with the rest of
memory (see docs/journal.md, "Visibility under a durable policy").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial

from kestrel.item import QItem


class Unsynced:
    """
    The not-yet-durable items of one queue, oldest first.

    Promises: L{show} is handed items in the order they were held, each at
    most once, and only from the callback L{hold} returned for that item or
    a later one; after L{drop}, no callback returned before it shows anything.
    """

    __slots__ = ("_items", "_held", "_shown", "_show", "_all_shown")

    def __init__(self, show: Callable[[QItem], None], all_shown: Callable[[], None]) -> None:
        """
        @param show: called with each item, oldest first, once the fsync
            covering its record succeeded (the queue appends it to what
            readers see and wakes a reader).
        @param all_shown: called after a callback showed the last item held.
        """
        self._items: deque[QItem] = deque()
        self._held = 0  # (numbers handed out, the last item's)
        self._shown = 0  # (the number of the last item shown or dropped)
        self._show = show
        self._all_shown = all_shown

    def __len__(self) -> int:
        return len(self._items)

    def hold(self, item: QItem) -> Callable[[object], bool]:
        """
        Keep C{item} unseen; return the callback for its record's durable
        Deferred, which shows it (and the older items held) and returns C{True}.
        """
        self._items.append(item)
        self._held += 1
        # (a partial, not a lambda: one Python frame fewer per durable add)
        return partial(self._synced, self._held)

    def _synced(self, number: int, _: object = None) -> bool:
        """The fsync covering held item C{number} succeeded: show it and every older one."""
        items = self._items
        if self._shown >= number:
            return True  # (shown by a later item's callback, or dropped)
        show = self._show
        while self._shown < number and items:
            self._shown += 1
            show(items.popleft())
        if not items:
            self._all_shown()
        return True

    def drop(self) -> None:
        """
        Forget every held item (memory is being rebuilt from the journal,
        which holds them only if they became durable).
        """
        self._items.clear()
        self._shown = self._held
