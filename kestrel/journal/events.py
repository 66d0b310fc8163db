"""
The journal's record stream read as queue events: the one switch over record types.

A journal record says what happened to a queue: an item was added, the
head removed, a read opened under an xid, confirmed or aborted, the xid
counter saved. Whoever replays a journal (the queue at startup, the
C{qdump} and C{qpack} tools) subclasses L{QueueEvents}, overriding the
events it cares about, and feeds records to L{event_applier}; what each
record type means, and how a Kestrel 1.x ADD becomes an item
(L{legacy_item}), is written here once. Readers that decode a journal into
columns of opcodes instead of record objects (the analytics scanner) take
the same table by opcode from the C{*_OPCODES} groups at the end.
"""

from __future__ import annotations

from collections.abc import Callable

from kestrel.item import QItem
from kestrel.journal import records as rec


def legacy_item(record: rec.LegacyAdd, now_ms: int) -> QItem:
    """
    The item of a Kestrel 1.x ADD: it carries no add time, so it is stamped
    C{now_ms} (as Kestrel does at replay); its expiry in seconds becomes ms.
    """
    return QItem(record.data, now_ms, record.expiry_s * 1000 if record.expiry_s else 0)


def item_of(record: rec.Record, now_ms: Callable[[], int]) -> QItem | None:
    """The item a record adds (ADD, ADDX, ADD_XID, CONTINUE), or C{None} for the others."""
    cls = type(record)
    if cls is rec.Add or cls is rec.AddXid or cls is rec.Continue:
        return QItem(record.data, record.add_time_ms, record.expiry_ms)  # type: ignore[union-attr]
    if cls is rec.LegacyAdd:
        return legacy_item(record, now_ms())  # type: ignore[arg-type]
    return None


class QueueEvents:
    """
    What a journal's records do to a queue, one method per event; every
    event does nothing unless overridden.

    Records map to events as follows: ADD, ADDX and ADD_XID -> L{added}
    (C{xid} is ADD_XID's, else 0); REMOVE -> L{removed};
    REMOVE_TENTATIVE_XID -> L{opened} with its xid, the xid-less
    REMOVE_TENTATIVE of Kestrel 1.x -> L{opened} with C{None} (the replayer
    numbers it with its counter, see L{kestrel.journal.records.next_xid});
    UNREMOVE -> L{unremoved}; CONFIRM_REMOVE -> L{confirmed}; SAVE_XID ->
    L{xid_saved}; CONTINUE -> L{continued} (by default L{confirmed} then
    L{added}).
    """

    __slots__ = ()

    def added(self, item: QItem, xid: int) -> None:
        """An item was added at the tail (C{xid}: an old ADD_XID's, else 0)."""

    def removed(self) -> None:
        """The head item was removed for good."""

    def opened(self, xid: int | None) -> None:
        """The head item was handed out under open read C{xid} (C{None}: number it yourself)."""

    def unremoved(self, xid: int) -> None:
        """Open read C{xid} was aborted: its item goes back to the head."""

    def confirmed(self, xid: int) -> None:
        """Open read C{xid} was confirmed: its item is gone."""

    def xid_saved(self, xid: int) -> None:
        """The xid counter stood at C{xid}."""

    def continued(self, xid: int, item: QItem) -> None:
        """Open read C{xid} was confirmed and C{item} added, in one record."""
        self.confirmed(xid)
        self.added(item, 0)


def event_applier(events: QueueEvents,
                  now_ms: Callable[[], int]) -> Callable[[rec.Record], None]:
    """
    A function that turns one record into its event on C{events}.

    C{now_ms} stamps legacy ADDs (see L{legacy_item}). The event methods
    are looked up once, here: the returned function is what a replay of
    millions of records calls per record.
    """
    added = events.added
    removed = events.removed
    opened = events.opened
    unremoved = events.unremoved
    confirmed = events.confirmed
    xid_saved = events.xid_saved
    continued = events.continued

    def apply(record: rec.Record) -> None:
        cls = type(record)
        if cls is rec.Add:
            added(QItem(record.data, record.add_time_ms, record.expiry_ms), 0)  # type: ignore[union-attr]
        elif cls is rec.Remove:
            removed()
        elif cls is rec.RemoveTentativeXid:
            opened(record.xid)  # type: ignore[union-attr]
        elif cls is rec.ConfirmRemove:
            confirmed(record.xid)  # type: ignore[union-attr]
        elif cls is rec.Unremove:
            unremoved(record.xid)  # type: ignore[union-attr]
        elif cls is rec.SaveXid:
            xid_saved(record.xid)  # type: ignore[union-attr]
        elif cls is rec.Continue:
            continued(record.xid,  # type: ignore[union-attr]
                      QItem(record.data, record.add_time_ms, record.expiry_ms))  # type: ignore[union-attr]
        elif cls is rec.AddXid:
            added(QItem(record.data, record.add_time_ms, record.expiry_ms),  # type: ignore[union-attr]
                  record.xid)  # type: ignore[union-attr]
        elif cls is rec.LegacyAdd:
            added(legacy_item(record, now_ms()), 0)  # type: ignore[arg-type]
        elif cls is rec.RemoveTentative:
            opened(None)
        else:
            raise TypeError(f"not a journal record: {record!r}")

    return apply


# The same record-to-event table, by opcode, for readers that decode a journal
# into columns (the analytics scanner and its replay) rather than into record
# objects; plain ints so that numpy and Spark take them as they are.
_O = rec.Opcode

#: Opcodes whose record adds an item (L{QueueEvents.added}, or the add of
#: L{QueueEvents.continued}).
ADD_OPCODES: tuple[int, ...] = tuple(map(int, (_O.ADD, _O.ADDX, _O.ADD_XID, _O.CONTINUE)))
#: Opcodes whose record carries its item's add time (all adds but Kestrel 1.x ADD).
TIMED_OPCODES: tuple[int, ...] = tuple(map(int, (_O.ADDX, _O.ADD_XID, _O.CONTINUE)))
#: Opcodes whose record carries an xid.
XID_OPCODES: tuple[int, ...] = tuple(map(int, (
    _O.SAVE_XID, _O.UNREMOVE, _O.CONFIRM_REMOVE, _O.ADD_XID, _O.CONTINUE,
    _O.REMOVE_TENTATIVE_XID)))
#: Opcodes whose record opens a read (L{QueueEvents.opened}).
OPEN_OPCODES: tuple[int, ...] = tuple(map(int, (_O.REMOVE_TENTATIVE, _O.REMOVE_TENTATIVE_XID)))
#: Opcodes whose record confirms an open read (L{QueueEvents.confirmed}, or
#: the confirm of L{QueueEvents.continued}).
CONFIRM_OPCODES: tuple[int, ...] = tuple(map(int, (_O.CONFIRM_REMOVE, _O.CONTINUE)))
#: Opcodes whose record takes an item away for good: a REMOVE or a confirm.
DEQUEUE_OPCODES: tuple[int, ...] = (int(_O.REMOVE), *CONFIRM_OPCODES)
#: Opcodes whose record aborts an open read (L{QueueEvents.unremoved}).
ABORT_OPCODES: tuple[int, ...] = (int(_O.UNREMOVE),)
del _O
