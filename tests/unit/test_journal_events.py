"""
kestrel.journal.events: each record type becomes its queue event, legacy
ADDs are stamped with the replay time, and what a record does not say (the
xid of a Kestrel 1.x open) is left to the replayer.
"""

from __future__ import annotations

import pytest

from kestrel.item import QItem
from kestrel.journal import records as rec
from kestrel.journal.events import QueueEvents, event_applier, item_of, legacy_item


class Recorder(QueueEvents):
    """Records every event as a tuple, keeping the default continued()."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def added(self, item: QItem, xid: int) -> None:
        self.events.append(("added", item.data, item.add_time_ms, item.expiry_ms, xid))

    def removed(self) -> None:
        self.events.append(("removed",))

    def opened(self, xid: int | None) -> None:
        self.events.append(("opened", xid))

    def unremoved(self, xid: int) -> None:
        self.events.append(("unremoved", xid))

    def confirmed(self, xid: int) -> None:
        self.events.append(("confirmed", xid))

    def xid_saved(self, xid: int) -> None:
        self.events.append(("xid_saved", xid))


@pytest.mark.parametrize(("record", "events"), [
    (rec.Add(b"a", 10, 20), [("added", b"a", 10, 20, 0)]),
    (rec.AddXid(7, b"x", 10, 0), [("added", b"x", 10, 0, 7)]),
    (rec.LegacyAdd(b"old", 3), [("added", b"old", 5000, 3000, 0)]),
    (rec.LegacyAdd(b"old", 0), [("added", b"old", 5000, 0, 0)]),
    (rec.Remove(), [("removed",)]),
    (rec.RemoveTentativeXid(4), [("opened", 4)]),
    (rec.RemoveTentative(), [("opened", None)]),
    (rec.Unremove(4), [("unremoved", 4)]),
    (rec.ConfirmRemove(4), [("confirmed", 4)]),
    (rec.SaveXid(99), [("xid_saved", 99)]),
    (rec.Continue(4, b"c", 11, 0), [("confirmed", 4), ("added", b"c", 11, 0, 0)]),
])
def test_each_record_becomes_its_event(record: rec.Record,
                                       events: list[tuple[object, ...]]) -> None:
    """One record, one event (CONTINUE: a confirm then an add, by default)."""
    recorder = Recorder()
    event_applier(recorder, lambda: 5000)(record)
    assert recorder.events == events


def test_every_record_type_of_the_codec_is_handled() -> None:
    """No record type the codec can produce falls through to the error."""
    samples = {rec.Add: rec.Add(b"", 0), rec.LegacyAdd: rec.LegacyAdd(b""),
               rec.AddXid: rec.AddXid(1, b"", 0), rec.Continue: rec.Continue(1, b"", 0),
               rec.Remove: rec.Remove(), rec.RemoveTentative: rec.RemoveTentative(),
               rec.RemoveTentativeXid: rec.RemoveTentativeXid(1), rec.SaveXid: rec.SaveXid(1),
               rec.Unremove: rec.Unremove(1), rec.ConfirmRemove: rec.ConfirmRemove(1)}
    assert set(samples) == set(rec.Record.__args__)  # type: ignore[attr-defined]
    apply = event_applier(QueueEvents(), lambda: 0)
    for record in samples.values():
        apply(record)
    with pytest.raises(TypeError):
        apply("not a record")  # type: ignore[arg-type]


def test_item_of_and_legacy_item() -> None:
    """item_of gives the added item of add records only; the clock is read only for legacy ADDs."""
    calls: list[int] = []

    def now() -> int:
        calls.append(1)
        return 42

    assert item_of(rec.Add(b"a", 1, 2), now) == QItem(b"a", 1, 2)
    assert item_of(rec.Continue(3, b"c", 1, 0), now) == QItem(b"c", 1, 0)
    assert item_of(rec.Remove(), now) is None
    assert calls == []
    assert item_of(rec.LegacyAdd(b"l", 2), now) == QItem(b"l", 42, 2000)
    assert calls == [1]
    assert legacy_item(rec.LegacyAdd(b"l", 0), 7) == QItem(b"l", 7, 0)
