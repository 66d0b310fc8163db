"""
Columnar scan of one journal file, with the server's record codec.

This module is Spark-free: L{scan_buffer} decodes a byte string (the record
layouts of L{kestrel.journal.records}) into numpy columns with no Python step
per record: L{frame_records} finds where records start (every byte that could
start one is linked to the next, and the chain from the file's start found by
pointer doubling), then numpy reads every field of all records at once.
L{decode} adds each record's times and snapshot marks (the columns the
one-process analysis works on), and L{to_batch} turns them into one Arrow
record batch, the shape the Spark data source and the events table use.

This is the columnar counterpart of L{kestrel.journal.records.decode_prefix}
(the tests hold it to the same records), not a second codec or a second
switch over record types: opcode names come from
L{kestrel.journal.records.Opcode} and what each opcode means from the groups
of L{kestrel.journal.events}. It works on opcode columns rather than record
objects because building one object per record would be most of its cost.

Time bracketing: only add records (ADDX, ADD_XID, CONTINUE) carry a time.
For them C{time_lb_ms == time_ub_ms == add_ms}. Any other record was written
after the latest add time seen before it in the file (or the file's
C{start_ms}) and before the next add time in the file (or the file's
C{end_ms}); C{time_ub_ms} is never below C{time_lb_ms}.

C{time_est_ms} is the estimate inside that bracket (L{time_estimates}): the
untimed records between two timed ones are spread evenly over the gap, as a
client reading at a steady pace would have written them. Minutes are counted
by it; windows, waits and expiries are computed from the bracket.
"""

from __future__ import annotations

import mmap

import attrs
import numpy as np
import pyarrow as pa

from kestrel.analytics.layout import JournalFile, local_path
from kestrel.journal.events import ADD_OPCODES, TIMED_OPCODES, XID_OPCODES
from kestrel.journal.records import Opcode

_ADD, _ADDX, _ADD_XID, _CONTINUE = (int(Opcode.ADD), int(Opcode.ADDX), int(Opcode.ADD_XID),
                                    int(Opcode.CONTINUE))
_SAVE_XID, _REMOVE_TENTATIVE_XID = int(Opcode.SAVE_XID), int(Opcode.REMOVE_TENTATIVE_XID)

#: The pseudo-opcode of the one trailer row every file contributes.
TRAILER_OP = -1

#: Opcodes that append an item (defined with the record-to-event table).
ADD_OPS = ADD_OPCODES
#: Opcodes whose record carries an add time.
TIMED_OPS = TIMED_OPCODES
#: Opcodes that carry an xid.
XID_OPS = XID_OPCODES

_NONE = np.iinfo(np.int64).min

SCHEMA = pa.schema([
    ("server", pa.string()),
    ("queue", pa.string()),
    ("file", pa.string()),
    ("file_seq", pa.int32()),
    ("archive", pa.bool_()),
    ("snapshot", pa.bool_()),
    ("filler", pa.bool_()),
    ("offset", pa.int64()),
    ("op", pa.int8()),
    ("xid", pa.int32()),
    ("size", pa.int32()),
    ("add_ms", pa.int64()),
    ("expiry_ms", pa.int64()),
    ("time_lb_ms", pa.int64()),
    ("time_ub_ms", pa.int64()),
    ("time_est_ms", pa.int64()),
    ("problem", pa.string()),
])
"""The columns of a scanned file: one row per record, plus one trailer row.

C{archive} marks rows of a file from an archive folder (traffic only).
C{snapshot} marks the records of a pack's or rewrite's snapshot (see
L{snapshot_masks}): they restate the queue, they are not client traffic;
C{filler} marks the empty ADDX records a pack writes for pent-up deletes
(size 0, added at or after the snapshot's bound): they stand for items already gone.

The trailer row has C{op == TRAILER_OP}, C{offset} = the clean end (just past
the last whole record), C{size} = the bytes after it (C{truncated_bytes}),
C{xid} = the number of records, C{add_ms} = the number of snapshot records,
C{expiry_ms} = the adds of the snapshot that may be client adds
(L{uncertain_adds}), and C{problem} = why decoding stopped early (C{None} when the file decoded
to its last byte)."""

SPARK_DDL = ("server string, queue string, file string, file_seq int, archive boolean, "
             "snapshot boolean, "
             "filler boolean, offset long, op byte, xid int, size int, add_ms long, "
             "expiry_ms long, time_lb_ms long, time_ub_ms long, time_est_ms long, problem string")
"""L{SCHEMA} in Spark's DDL syntax."""


@attrs.frozen
class Scan:
    """
    The records of one journal file as columns.

    Integer columns use C{numpy.iinfo(int64).min} (or 0 for C{xid} and
    C{size}) where a record has no such field; the masks say which rows are set.
    """

    offset: np.ndarray
    op: np.ndarray
    xid: np.ndarray
    size: np.ndarray
    add_ms: np.ndarray
    expiry_ms: np.ndarray
    clean_end: int
    truncated_bytes: int
    problem: str | None

    @property
    def count(self) -> int:
        """Return the number of whole records."""
        return len(self.op)


#: Record length of the opcodes without a payload: the opcode, plus an xid if any.
_FIXED = {int(o): 5 if o in XID_OPCODES else 1 for o in Opcode if o not in ADD_OPCODES}
#: Per opcode byte (0-255): the fixed length, 0 for the adds (their length is read), -1
#: for a byte that is no opcode.
_LENGTH = np.full(256, -1, np.int64)
for _op, _n in _FIXED.items():
    _LENGTH[_op] = _n
_LENGTH[[_ADD, _ADDX, _ADD_XID, _CONTINUE]] = 0
#: Per add opcode: where its i32 block size is, the bytes before the block, its minimum.
_SIZE_AT = {_ADD: (1, 5, 4), _ADDX: (1, 5, 16), _ADD_XID: (5, 9, 16), _CONTINUE: (5, 9, 16)}
#: Bytes whose possible records are found at once (see L{frame_records}); it bounds
#: the framer's memory (about 10 bytes per byte of the chunk).
CHUNK = 1 << 20
#: Bytes of a chunk whose chain is followed at once: short windows keep the pointer
#: doubling to a few steps.
WINDOW = 1 << 18

#: Kept for callers that set it; the framer no longer filters block sizes by the bytes left.
SMALL = 1 << 24

_VALID, _TRUNCATED, _SHORT = 0, 1, 2
#: The largest opcode byte.
_MAX_OP = max(int(o) for o in Opcode)
#: Per opcode byte: the bytes of its head (the whole record for fixed ones), whether it
#: has a block, whether its size is after an xid, and the block's minimum size.
_HEAD = np.where(_LENGTH > 0, _LENGTH, 0)
_HAS_BLOCK = np.zeros(256, bool)
_SIZE_LATE = np.zeros(256, bool)
_MINIMUM = np.zeros(256, np.int64)
for _op, (_at, _head, _min) in _SIZE_AT.items():
    _HEAD[_op] = _head
    _HAS_BLOCK[_op] = True
    _SIZE_LATE[_op] = _at == 5
    _MINIMUM[_op] = _min


def _headers(data: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """
    Read, for every position in C{at} whose byte is an opcode, the record it would start.

    All positions at once: the i32 after the opcode and the one four bytes
    later are read for every position, and tables indexed by the opcode say
    which is the block size, how long the head is and the block's minimum.

    @return: the record lengths, a status per position (L{_VALID}, L{_TRUNCATED}: it
        runs past the end, L{_SHORT}: an add's block is below its minimum) and the
        block sizes (0 for records without one).
    """
    end = len(data)
    ops = data[at]
    head = _HEAD[ops]
    whole = at + head <= end
    reads = whole & _HAS_BLOCK[ops]
    block = np.zeros(len(at), np.int64)
    if reads.any():
        pos = at[reads]
        late = _SIZE_LATE[ops[reads]]
        size = _gather(data, pos + np.where(late, 5, 1), 4, "<i4").astype(np.int64)
        block[reads] = size
    length = np.where(_HAS_BLOCK[ops], head + block, _LENGTH[ops])
    status = np.where(~whole, _TRUNCATED,
                      np.where(block < _MINIMUM[ops], _SHORT,
                               np.where(at + length > end, _TRUNCATED, _VALID))).astype(np.int8)
    return length, status, block


def _problem(data: np.ndarray, pos: int) -> str | None:
    """Say why no whole record starts at C{pos} (C{None}: one does, or C{pos} is the end)."""
    if pos >= len(data):
        return None
    op = int(data[pos])
    if _LENGTH[op] < 0:
        return f"invalid opcode {op}"
    _, status, block = _headers(data, np.array([pos], np.int64))
    if status[0] == _TRUNCATED:
        return "truncated record"
    if status[0] == _SHORT:
        return f"block of {int(block[0])} bytes is shorter than {_SIZE_AT[op][2]}"
    return None


def _links(data: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """
    Return the opcode positions of C{at} that may start a record, their records' lengths,
    and which of those records are valid.

    The lean bulk form of L{_headers} (the same rules: a record is valid when its
    head and block fit in C{data} and an add's block is at least its minimum):
    one i32 read per position (a second only for the opcodes whose size follows an
    xid), read positions clipped inside the data (a clipped read belongs to a record
    that does not fit, which is invalid anyway).
    """
    end = len(data)
    ops = data[at]
    if end < 4:
        head = _HEAD[ops]
        return at, head, (at + head <= end) & ~_HAS_BLOCK[ops]
    view = np.ndarray((end - 3,), "<i4", data, 0, (1,))
    size32 = view[np.minimum(at + 1, end - 4)]
    # most candidates are zero bytes of heads (sizes, times, empty expiries): an ADD
    # whose block is under 4 bytes or runs past the end, rejected before any wider work
    keep = np.flatnonzero((ops != _ADD) | ((size32 >= _MINIMUM[_ADD])
                                           & (size32 <= end - _HEAD[_ADD] - at)))
    at, ops = at[keep], ops[keep]
    size = size32[keep].astype(np.int64)
    head = _HEAD[ops]
    late = np.flatnonzero(_SIZE_LATE[ops])
    if len(late):
        size[late] = view[np.minimum(at[late] + 5, end - 4)]
    block = _HAS_BLOCK[ops]
    length = np.where(block, head + size, head)
    valid = (at + length <= end) & (~block | (size >= _MINIMUM[ops]))
    return at, length, valid


def _chain(succ: np.ndarray, first: int, stop: int) -> np.ndarray:
    """
    Return the indices of the chain of nodes from C{first}, within nodes C{[first, stop)}.

    C{succ[i]} is the index of the node just after node C{i}'s record (or -1).
    The chain is found by pointer doubling (C{J[k+1] = J[k][J[k]]}, a few
    gathers over the window's nodes), and listed by doubling its known prefix.
    """
    sentinel = stop - first
    local = succ[first:stop] - first
    jump = np.append(np.where((local >= 0) & (local < sentinel), local, sentinel), sentinel)
    levels = [jump]
    while levels[-1][0] != sentinel:
        j = levels[-1]
        levels.append(j[j])
    chain = np.zeros(1, np.int64)
    for j in levels:
        step = j[chain]
        chain = np.concatenate((chain, step[step != sentinel]))
        if step[-1] == sentinel:
            break
    return chain + first


def frame_records(buf: bytes | bytearray | memoryview | mmap.mmap,
                  ) -> tuple[np.ndarray, int, str | None]:
    """
    Find where every whole record of C{buf} starts, without a Python step per record.

    One L{CHUNK} at a time, every opcode byte is found in one pass
    (C{data <= 9}); those that start a valid record that fits (L{_links}: the
    zero bytes of heads are dropped first, on their block size alone) become
    nodes, each linked (through a table of node by position) to the node just
    past its record; the chain from the chunk's first record is then
    followed one L{WINDOW} of nodes at a time (L{_chain}). A record that runs
    past the chunk starts the next chunk at its end.

    @return: the start offsets, the clean end (just past the last whole
        record), and why decoding stopped early (C{None} at the end of C{buf}).
    """
    data = np.frombuffer(buf, dtype=np.uint8)
    end = len(data)
    parts = []
    pos = 0
    problem = None
    while pos < end:
        problem = _problem(data, pos)
        if problem is not None:
            break
        stop = min(end, pos + CHUNK)
        at = np.flatnonzero(data[pos:stop] <= _MAX_OP)
        at += pos
        at, length, valid = _links(data, at)
        nodes = at[valid]
        nxt = nodes + length[valid]
        # node index by position in the chunk (-1: no node there, or past the chunk)
        slot = np.full(stop - pos + 1, -1, np.int32)
        slot[nodes - pos] = np.arange(len(nodes))
        succ = slot[np.minimum(nxt - pos, stop - pos)]
        first = 0  # pos is a whole record: the chunk's first node
        while True:
            window_end = max(first + 1, int(np.searchsorted(nodes, nodes[first] + WINDOW)))
            chain = _chain(succ, first, window_end)
            parts.append(nodes[chain])
            last = int(chain[-1])
            if succ[last] < 0:
                pos = int(nxt[last])
                break
            first = int(succ[last])
    offsets = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return offsets, pos, problem


def _gather(data: np.ndarray, at: np.ndarray, width: int, dtype: str) -> np.ndarray:
    """Read one little-endian integer of C{width} bytes at every offset in C{at}."""
    if len(at) == 0:
        return np.zeros(0, dtype=dtype)
    # a view with a one-byte stride: element i is the integer whose bytes start at i
    view = np.ndarray((len(data) - width + 1,), dtype, data, 0, (1,))
    return view[at]


def scan_buffer(buf: bytes | bytearray | memoryview | mmap.mmap) -> Scan:
    """
    Decode every whole record of C{buf}, never raising on bad data.

    Decoding stops at a truncated tail or at the first corrupt record; the
    bytes from there on are reported as C{truncated_bytes} with the reason
    in C{problem}, which is where the server's replay cuts the file. The
    layouts are those of L{kestrel.journal.records}; fields are read with
    numpy over all records at once (L{frame_records} only finds them).
    """
    offsets, clean_end, problem = frame_records(buf)
    data = np.frombuffer(buf, dtype=np.uint8)
    n = len(offsets)
    op = data[offsets].astype(np.int8) if n else np.zeros(0, np.int8)
    xid = np.zeros(n, np.int32)
    size = np.zeros(n, np.int32)
    add_ms = np.full(n, _NONE, np.int64)
    exp_ms = np.full(n, _NONE, np.int64)
    with_xid = np.isin(op, XID_OPS)
    xid[with_xid] = _gather(data, offsets[with_xid] + 1, 4, "<i4")
    addx = op == _ADDX
    o = offsets[addx]
    size[addx] = _gather(data, o + 1, 4, "<i4") - 16
    add_ms[addx] = _gather(data, o + 5, 8, "<i8")
    exp_ms[addx] = _gather(data, o + 13, 8, "<i8")
    blocks = (op == _ADD_XID) | (op == _CONTINUE)
    o = offsets[blocks]
    size[blocks] = _gather(data, o + 5, 4, "<i4") - 16
    add_ms[blocks] = _gather(data, o + 9, 8, "<i8")
    exp_ms[blocks] = _gather(data, o + 17, 8, "<i8")
    legacy = op == _ADD
    o = offsets[legacy]
    size[legacy] = _gather(data, o + 1, 4, "<i4") - 4
    exp_s = _gather(data, o + 5, 4, "<i4").astype(np.int64)
    exp_ms[legacy] = np.where(exp_s != 0, exp_s * 1000, _NONE)
    exp_ms[(exp_ms == 0)] = _NONE
    return Scan(offset=offsets, op=op, xid=xid, size=size, add_ms=add_ms, expiry_ms=exp_ms,
                clean_end=clean_end, truncated_bytes=len(data) - clean_end, problem=problem)


def time_bounds(scan: Scan, start_ms: int | None,
                end_ms: int | None) -> tuple[np.ndarray, np.ndarray]:
    """
    Bracket the write time of every record of a file (see the module docstring).

    @return: C{(lower, upper)} int64 arrays; C{numpy.iinfo(int64).min} where
        no bound is known.
    """
    n = scan.count
    timed = scan.add_ms != _NONE
    start = _NONE if start_ms is None else start_ms
    lb = np.maximum.accumulate(np.concatenate(([start], scan.add_ms[:-1]))) if n else \
        np.empty(0, np.int64)
    if n:
        lb = np.maximum(lb, start)
    idx = np.where(timed, np.arange(n), n)
    next_idx = np.minimum.accumulate(idx[::-1])[::-1] if n else idx
    # the next timed record strictly after each row
    after = np.concatenate((next_idx[1:], [n])) if n else next_idx
    padded = np.concatenate((scan.add_ms, [_NONE if end_ms is None else end_ms]))
    ub = padded[after]
    ub = np.where((ub != _NONE) & (lb != _NONE) & (ub < lb), lb, ub)
    lb = np.where(timed, scan.add_ms, lb)
    ub = np.where(timed, scan.add_ms, ub)
    return lb.astype(np.int64), ub.astype(np.int64)


def time_estimates(scan: Scan, lb: np.ndarray, ub: np.ndarray) -> np.ndarray:
    """
    Estimate the write time of every record inside its bracket C{[lb, ub]}.

    A timed record keeps its own time. A run of C{m} untimed records is
    spread evenly over its bracket: the k-th (from 0) of a run followed by a
    timed record at C{lb + (ub - lb) * (k + 1) / (m + 1)}; of a run that ends
    the file (bounded by the file's end) at C{lb + (ub - lb) * (k + 1) / m},
    so that its last record lands on the file's end. With one bound unknown
    the other is taken; with neither, the estimate is unknown too. Estimates
    never go backwards within a file.
    """
    n = scan.count
    timed = scan.add_ms != _NONE
    est = np.where(timed, scan.add_ms, np.where(lb != _NONE, lb, ub)).astype(np.int64)
    both = ~timed & (lb != _NONE) & (ub != _NONE)
    if not both.any():
        return est
    untimed = np.flatnonzero(~timed)
    run = np.cumsum(timed)[untimed]
    # position within the run, and the run's length
    first = np.concatenate(([True], run[1:] != run[:-1]))
    start_idx = np.flatnonzero(first)
    lengths = np.diff(np.concatenate((start_idx, [len(untimed)])))
    run_no = np.cumsum(first) - 1
    k = np.arange(len(untimed)) - start_idx[run_no]
    m = lengths[run_no]
    last_row = untimed[start_idx + lengths - 1][run_no]
    ends_file = last_row == n - 1
    frac = (k + 1) / (m + np.where(ends_file, 0, 1))
    bounded = both[untimed]
    lo, hi = lb[untimed], ub[untimed]
    # (a width only where both bounds are known: with the _NONE sentinel the
    # difference overflows, and its float would not cast back)
    width = np.where(bounded, hi - lo, 0)
    spread = lo + np.floor(width.astype(np.float64) * frac).astype(np.int64)
    est[untimed] = np.where(bounded, np.minimum(spread, hi), est[untimed])
    return est


def snapshot_masks(op: np.ndarray, xid: np.ndarray, size: np.ndarray, add_ms: np.ndarray,
                   bound_ms: int | None) -> tuple[np.ndarray, np.ndarray]:
    """
    Find the snapshot a pack or rewrite wrote at the start of a file, by content.

    A snapshot starts with SAVE_XID(counter); then come the open reads, each
    an ADDX followed by REMOVE_TENTATIVE_XID of an xid at or below the
    counter; then ADDX records: re-emitted items (added at or before
    C{bound_ms}) and fillers (0 bytes, added at or after C{bound_ms}). The
    snapshot ends at the first other record, or the first ADDX that is
    neither. A file that does not start with SAVE_XID has no snapshot.

    @return: C{(snapshot, filler)} boolean arrays, one entry per record.
    """
    n = len(op)
    snap = np.zeros(n, bool)
    filler = np.zeros(n, bool)
    if n == 0 or op[0] != _SAVE_XID:
        return snap, filler
    counter = int(xid[0])
    i = 1
    seen: set[int] = set()
    while i + 1 < n and op[i] == _ADDX and op[i + 1] == _REMOVE_TENTATIVE_XID:
        x = int(xid[i + 1])
        if x > counter or x in seen:
            break
        seen.add(x)
        i += 2
    rest_op = op[i:]
    is_addx = rest_op == _ADDX
    if bound_ms is None:
        inside = is_addx
        fill = np.zeros(len(rest_op), bool)
    else:
        fill = is_addx & (size[i:] == 0) & (add_ms[i:] >= bound_ms)
        inside = is_addx & ((add_ms[i:] <= bound_ms) | fill)
    stop = int(np.argmin(inside)) if not inside.all() else len(inside)
    snap[:i + stop] = True
    filler[i:i + stop] = fill[:stop]
    return snap, filler


def uncertain_adds(op: np.ndarray, snapshot: np.ndarray, filler: np.ndarray,
                   bound_exact: bool) -> int:
    """
    Return how many adds the snapshot of a file may have taken from its clients.

    With an exact bound, only the add that triggered a rewrite (written
    right after the snapshot with an add time taken before it) can hide
    among the re-emitted items, when client records follow the snapshot.
    Without one (a rewritten live file, and no archive to date the rewrite),
    any add of the snapshot's item run may be a client's.
    """
    count = int(snapshot.sum())
    if count == 0:
        return 0
    if bound_exact:
        return int(len(op) > count)
    items = int((snapshot & (op == _ADDX) & ~filler).sum())
    opened = int((snapshot & (op == _REMOVE_TENTATIVE_XID)).sum())
    return max(0, items - opened)


@attrs.frozen
class Decoded:
    """
    One file's records as numpy columns, with what the file's place adds to them.

    C{lb}, C{ub} and C{est} are the time bounds and estimate of every record
    (L{time_bounds}, L{time_estimates}); C{snapshot} and C{filler} its
    snapshot marks (L{snapshot_masks}); C{uncertain} the snapshot's adds that
    may be client adds (L{uncertain_adds}).
    """

    scan: Scan
    lb: np.ndarray
    ub: np.ndarray
    est: np.ndarray
    snapshot: np.ndarray
    filler: np.ndarray
    uncertain: int


def decode(scan: Scan, jf: JournalFile) -> Decoded:
    """Add to the scan of file C{jf} its records' times and snapshot marks."""
    lb, ub = time_bounds(scan, jf.start_ms, jf.end_ms)
    est = time_estimates(scan, lb, ub)
    snapshot, filler = snapshot_masks(scan.op, scan.xid, scan.size, scan.add_ms, jf.bound_ms)
    return Decoded(scan, lb, ub, est, snapshot, filler,
                   uncertain_adds(scan.op, snapshot, filler, jf.bound_exact))


def decode_local(jf: JournalFile) -> Decoded:
    """Decode a local journal file, memory-mapped (nothing returned refers to the map)."""
    with open(local_path(jf.path), "rb") as fh:
        try:
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            return decode(scan_buffer(b""), jf)
        try:
            return decode(scan_buffer(mapped), jf)
        finally:
            mapped.close()


def to_batch(scan: Scan, jf: JournalFile) -> pa.RecordBatch:
    """Return the scan of file C{jf} as a record batch of L{SCHEMA}, trailer row last."""
    return decoded_batch(decode(scan, jf), jf)


def decoded_batch(d: Decoded, jf: JournalFile) -> pa.RecordBatch:
    """Return the decoded file C{jf} as a record batch of L{SCHEMA}, trailer row last."""
    scan = d.scan
    n = scan.count
    lb, ub, est, snapshot, filler, uncertain = d.lb, d.ub, d.est, d.snapshot, d.filler, \
        d.uncertain
    op = scan.op
    is_add = np.isin(op, ADD_OPS)
    has_xid = np.isin(op, XID_OPS)
    rows = n + 1

    def ints(values: np.ndarray, valid: np.ndarray, trailer: int | None,
             typ: pa.DataType) -> pa.Array:
        data = np.concatenate((values, [0 if trailer is None else trailer])).astype(
            typ.to_pandas_dtype())
        mask = np.concatenate((~valid, [trailer is None]))
        return pa.array(data, type=typ, mask=mask)

    columns = [
        pa.repeat(pa.scalar(jf.server, pa.string()), rows),
        pa.repeat(pa.scalar(jf.queue, pa.string()), rows),
        pa.repeat(pa.scalar(jf.name, pa.string()), rows),
        pa.repeat(pa.scalar(jf.seq, pa.int32()), rows),
        pa.repeat(pa.scalar(jf.archive, pa.bool_()), rows),
        pa.array(np.concatenate((snapshot, [False]))),
        pa.array(np.concatenate((filler, [False]))),
        pa.array(np.concatenate((scan.offset, [scan.clean_end]))),
        pa.array(np.concatenate((op, [TRAILER_OP])).astype(np.int8)),
        ints(scan.xid, has_xid, n, pa.int32()),
        ints(scan.size, is_add, scan.truncated_bytes, pa.int32()),
        ints(scan.add_ms, scan.add_ms != _NONE, int(snapshot.sum()), pa.int64()),
        ints(scan.expiry_ms, scan.expiry_ms != _NONE, uncertain, pa.int64()),
        ints(lb, lb != _NONE, None, pa.int64()),
        ints(ub, ub != _NONE, None, pa.int64()),
        ints(est, est != _NONE, None, pa.int64()),
        pa.array([None] * n + [scan.problem], pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


def scan_file(jf: JournalFile, data: bytes | memoryview) -> pa.RecordBatch:
    """Decode the bytes C{data} of file C{jf} into a record batch of L{SCHEMA}."""
    return to_batch(scan_buffer(data), jf)


def read_local(jf: JournalFile) -> pa.RecordBatch:
    """Scan a local journal file (memory-mapped) into one record batch."""
    return decoded_batch(decode_local(jf), jf)
