"""
A journal generator with known truth, for the analytics tests.

L{QueueWriter} drives an object-level model of one queue (items, open reads,
a clock) and writes the records a server would write, rotating files and
packing like Kestrel. Every record it writes is logged with what the model
knows: the true write time, the item it touched, and the model's state after
it. The tests compute every expected output from these logs, never from the
job's own code.
"""

from __future__ import annotations

import os
import random
from collections import deque
from dataclasses import dataclass, field

from kestrel.journal import records

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@dataclass
class Item:
    """One item of the model."""

    ident: int
    data: bytes
    add_ms: int | None
    expiry_ms: int | None
    filler: bool = False


@dataclass
class Rec:
    """One record written, with the model's view of it."""

    file: str
    offset: int
    op: int
    xid: int | None
    size: int | None
    add_ms: int | None
    expiry_ms: int | None
    item: Item | None = None
    removed: Item | None = None
    queued: int = 0
    open_reads: int = 0
    nbytes: int = 0
    packed: bool = False
    filler: bool = False


@dataclass
class JFile:
    """One file written: its records, its timestamp bounds, and whether it counts."""

    name: str
    kind: str
    ts: int | None
    data: bytearray = field(default_factory=bytearray)
    recs: list[Rec] = field(default_factory=list)
    counted: bool = True
    truncated: int = 0
    mtime_ms: int | None = None


class QueueWriter:
    """Writes one queue's journal files while keeping the model's truth."""

    def __init__(self, server: str, queue: str, rng: random.Random, now: int = T0) -> None:
        self.server = server
        self.queue = queue
        self.rng = rng
        self.now = now
        self.items: deque[Item] = deque()
        self.open: dict[int, Item] = {}
        self.next_xid = 1
        self.next_ident = 0
        self.files: list[JFile] = []
        self.current = JFile(queue, "live", None)

    # -- model helpers -------------------------------------------------
    def _nbytes(self) -> int:
        return sum(len(i.data) for i in self.items) + sum(len(i.data) for i in self.open.values())

    def _emit(self, raw: bytes, op: int, *, xid: int | None = None, item: Item | None = None,
              removed: Item | None = None, target: JFile | None = None,
              packed: bool = False) -> None:
        f = target or self.current
        rec = Rec(f.name, len(f.data), op, xid,
                  len(item.data) if item else None,
                  item.add_ms if item else None,
                  item.expiry_ms if item else None, item=item, removed=removed,
                  queued=len(self.items), open_reads=len(self.open), nbytes=self._nbytes(),
                  packed=packed, filler=bool(item and item.filler))
        f.data += raw
        f.recs.append(rec)

    def _new_item(self, ttl_ms: int | None = None, size: int | None = None) -> Item:
        self.next_ident += 1
        n = self.rng.choice([0, 1, 5, 30, 100, 700, 3000]) if size is None else size
        return Item(self.next_ident, bytes([65 + self.next_ident % 26]) * n, self.now,
                    self.now + ttl_ms if ttl_ms else None)

    def tick(self, max_ms: int = 20_000) -> None:
        """Advance the clock by a random amount (at least 1 ms)."""
        self.now += self.rng.randint(1, max_ms)

    # -- operations ------------------------------------------------------
    def add(self, ttl_ms: int | None = None, size: int | None = None, op: int = 2) -> Item:
        """Add an item with ADDX (or ADD_XID with C{op=7})."""
        item = self._new_item(ttl_ms, size)
        self.items.append(item)
        if op == 7:
            raw = records.AddXid(0, item.data, item.add_ms, item.expiry_ms or 0).encode()
            self._emit(raw, 7, xid=0, item=item)
        else:
            raw = records.encode_add(item.data, item.add_ms, item.expiry_ms or 0)
            self._emit(raw, 2, item=item)
        return item

    def legacy_add(self) -> Item:
        """Add an item with Kestrel 1.x's ADD (no add time, expiry in seconds)."""
        item = self._new_item(size=self.rng.randint(0, 50))
        item.add_ms = None
        item.expiry_ms = (self.now // 1000 + 3600) * 1000
        self.items.append(item)
        raw = records.LegacyAdd(item.data, item.expiry_ms // 1000).encode()
        self._emit(raw, 0, item=item)
        return item

    def remove(self) -> None:
        """Remove the head for good."""
        gone = self.items.popleft()
        self._emit(records.REMOVE_BYTES, 1, removed=gone)

    def open_read(self) -> int:
        """Open a reliable read of the head; return its xid."""
        xid = self.next_xid
        self.next_xid += 1
        self.open[xid] = self.items.popleft()
        self._emit(records.encode_xid(9, xid), 9, xid=xid)
        return xid

    def abort(self, xid: int) -> None:
        """Abort open read C{xid}: its item goes back to the head."""
        self.items.appendleft(self.open.pop(xid))
        self._emit(records.encode_xid(5, xid), 5, xid=xid)

    def confirm(self, xid: int) -> None:
        """Confirm open read C{xid}."""
        gone = self.open.pop(xid)
        self._emit(records.encode_xid(6, xid), 6, xid=xid, removed=gone)

    def continue_(self, xid: int) -> None:
        """Confirm C{xid} and add a new item in one CONTINUE record."""
        gone = self.open.pop(xid)
        item = self._new_item()
        self.items.append(item)
        raw = records.Continue(xid, item.data, item.add_ms, item.expiry_ms or 0).encode()
        self._emit(raw, 8, xid=xid, item=item, removed=gone)

    def save_xid(self) -> None:
        """Write SAVE_XID with the current counter."""
        self._emit(records.encode_xid(4, self.next_xid), 4, xid=self.next_xid)

    def random_ops(self, count: int) -> None:
        """Perform C{count} random valid operations, ticking the clock between them."""
        rng = self.rng
        for _ in range(count):
            self.tick()
            r = rng.random()
            if r < 0.45 or not self.items and not self.open:
                self.add(ttl_ms=rng.choice([None, None, 30_000, 600_000]),
                         op=7 if rng.random() < 0.03 else 2)
            elif r < 0.65 and self.items:
                self.remove()
            elif r < 0.80 and self.items and len(self.open) < 4:
                self.open_read()
            elif self.open:
                xid = rng.choice(sorted(self.open))
                choice = rng.random()
                if choice < 0.3:
                    self.abort(xid)
                elif choice < 0.9:
                    self.confirm(xid)
                else:
                    self.continue_(xid)
            elif r < 0.9 and self.current.recs:
                # the server writes SAVE_XID only at the start of a snapshot (pack or
                # rewrite); a file starting with it is read as one
                self.save_xid()
            else:
                self.legacy_add()

    # -- files -----------------------------------------------------------
    def rotate(self) -> None:
        """Rename the live file to C{<q>.<now>} and start a new one (at least 1 ms later)."""
        self.tick(5_000)
        name = f"{self.queue}.{self.now}"
        self.current.name = name
        self.current.kind = "rotated"
        self.current.ts = self.now
        for r in self.current.recs:
            r.file = name
        self.files.append(self.current)
        self.current = JFile(self.queue, "live", None)
        self.tick(5_000)

    def pack(self, fillers: int = 0) -> JFile:
        """
        Write C{<q>.<P>.pack} for the last rotated file P, as Kestrel's packer would.

        Every file so far stops counting (they stay on disk). The pack holds
        SAVE_XID (the xid counter), the open reads (ADDX + REMOVE_TENTATIVE_XID,
        descending xid), then C{fillers} empty items added after P, then the
        queued items: every record of it is a snapshot record, not traffic.
        """
        last = self.files[-1]
        for f in self.files:
            f.counted = False
        pack = JFile(f"{last.name}.pack", "pack", last.ts)
        saved_items, saved_open = self.items, self.open
        self.items, self.open = deque(), {}
        self._emit(records.encode_xid(4, self.next_xid - 1), 4, xid=self.next_xid - 1,
                   target=pack, packed=True)
        for xid in sorted(saved_open, reverse=True):
            item = saved_open[xid]
            self.items.append(item)
            raw = records.encode_add(item.data, item.add_ms, item.expiry_ms or 0)
            self._emit(raw, 2, item=item, target=pack, packed=True)
            self.open[xid] = self.items.popleft()
            self._emit(records.encode_xid(9, xid), 9, xid=xid, target=pack, packed=True)
        for _ in range(fillers):
            item = Item(0, b"", self.now, None, filler=True)
            self.items.append(item)
            self._emit(records.encode_add(b"", item.add_ms), 2, item=item, target=pack, packed=True)
        for item in saved_items:
            self.items.append(item)
            if item.add_ms is None:
                raw = records.LegacyAdd(item.data, (item.expiry_ms or 0) // 1000).encode()
                self._emit(raw, 0, item=item, target=pack, packed=True)
            else:
                self._emit(records.encode_add(item.data, item.add_ms, item.expiry_ms or 0), 2,
                           item=item, target=pack, packed=True)
        self.files.append(pack)
        self.tick(1_000)
        return pack

    def truncate_tail(self, target: JFile | None = None) -> int:
        """Append a partial record (a write cut short) to a file; return its length."""
        f = target or self.current
        partial = records.encode_add(b"lost" * 10, self.now)[: self.rng.randint(1, 40)]
        f.data += partial
        f.truncated += len(partial)
        return len(partial)

    def finish(self) -> list[JFile]:
        """Close the live file (its mtime is the clock now) and return every file."""
        self.current.mtime_ms = self.now
        self.files.append(self.current)
        return self.files

    def write(self, folder: str) -> list[JFile]:
        """Write every file into C{folder}; the live file's mtime is set to its end time."""
        files = self.finish()
        os.makedirs(folder, exist_ok=True)
        for f in files:
            path = os.path.join(folder, f.name)
            with open(path, "wb") as fh:
                fh.write(f.data)
            if f.mtime_ms is not None:
                os.utime(path, ns=(f.mtime_ms * 1_000_000, f.mtime_ms * 1_000_000))
        return files
