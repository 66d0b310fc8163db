"""The strict request decoder of the thrift protocol (FrameReader), against thriftpy2's encoder."""

from __future__ import annotations

import struct

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from thriftpy2.protocol.binary import TBinaryProtocol
from thriftpy2.thrift import TMessageType, TType
from thriftpy2.transport.memory import TMemoryBuffer

from kestrel.protocols.thrift import FrameError, FrameReader, kestrel_thrift

Kestrel = kestrel_thrift.Kestrel

_i32 = st.integers(-(2**31), 2**31 - 1)
_names = st.text(max_size=20)
_args = st.one_of(
    st.builds(Kestrel.put_args, queue_name=_names, items=st.lists(st.binary(max_size=64)),
              expiration_msec=_i32),
    st.builds(Kestrel.get_args, queue_name=_names, max_items=_i32, timeout_msec=_i32,
              auto_abort_msec=_i32),
    st.builds(Kestrel.confirm_args, queue_name=_names,
              ids=st.sets(st.integers(-(2**63), 2**63 - 1))),
    st.builds(Kestrel.abort_args, queue_name=_names, ids=st.sets(st.integers(0, 2**40))),
    st.builds(Kestrel.set_status_args, status=st.integers(0, 3)),
    st.builds(Kestrel.flush_all_queues_args),
)


def encode(api: str, args, seqid: int, strict: bool) -> bytes:
    buf = TMemoryBuffer()
    proto = TBinaryProtocol(buf, strict_write=strict)
    proto.write_message_begin(api, TMessageType.CALL, seqid)
    args.write(proto)
    proto.write_message_end()
    return buf.getvalue()


def _api_of(args) -> str:
    return type(args).__name__[: -len("_args")]


@given(_args, _i32, st.booleans())
def test_decodes_what_thriftpy2_encodes(args, seqid, strict) -> None:
    """Every request thriftpy2 encodes (strict or old-style header) decodes to equal arguments."""
    api = _api_of(args)
    reader = FrameReader(encode(api, args, seqid, strict))
    assert reader.read_message_begin() == (api, TMessageType.CALL, seqid)
    decoded = reader.read_struct(type(args)())
    assert decoded == args


@given(_args, st.data())
def test_truncated_frames_raise_frame_error(args, data) -> None:
    """Any strict prefix of a request raises FrameError, never another error or a wrong value."""
    frame = encode(_api_of(args), args, 1, True)
    cut = data.draw(st.integers(0, len(frame) - 1))
    reader = FrameReader(frame[:cut])
    with pytest.raises(FrameError):
        reader.read_message_begin()
        reader.read_struct(type(args)())


@given(st.binary(max_size=200))
@example(b"")
@example(encode("put", Kestrel.put_args(queue_name="q", items=[b"a"], expiration_msec=0), 1, True))
def test_garbage_raises_only_frame_error(garbage) -> None:
    """Arbitrary bytes either raise FrameError or decode into values of the IDL's types."""
    reader = FrameReader(garbage)
    try:
        name, message_type, seqid = reader.read_message_begin()
        decoded = reader.read_struct(Kestrel.put_args())
    except FrameError:
        return
    assert isinstance(name, str)
    assert isinstance(message_type, int)
    assert isinstance(seqid, int)
    assert isinstance(decoded, Kestrel.put_args)
    assert decoded.queue_name is None or isinstance(decoded.queue_name, (str, bytes))
    assert decoded.items is None or all(isinstance(item, bytes) for item in decoded.items)
    assert decoded.expiration_msec is None or isinstance(decoded.expiration_msec, int)


def test_huge_declared_sizes_fail_fast() -> None:
    """Sizes larger than the bytes left are refused at once (no allocation, no long loop)."""
    header = struct.pack(">iI", -2147418111, 3) + b"put" + struct.pack(">i", 1)
    huge_string = header + struct.pack(">bhi", TType.STRING, 1, 10**9) + b"abc"
    with pytest.raises(FrameError, match="string of 1000000000 bytes"):
        reader = FrameReader(huge_string)
        reader.read_message_begin()
        reader.read_struct(Kestrel.put_args())
    stop_list = header + struct.pack(">bhbi", TType.LIST, 2, TType.STOP, 2**31 - 1)
    with pytest.raises(FrameError, match="container of 2147483647 elements"):
        reader = FrameReader(stop_list)
        reader.read_message_begin()
        reader.read_struct(Kestrel.put_args())


def test_mistyped_and_unknown_fields_are_skipped() -> None:
    """A field with an unexpected type or id is skipped; the others are still read."""
    header = struct.pack(">iI", -2147418111, 3) + b"put" + struct.pack(">i", 1)
    body = (struct.pack(">bhi", TType.I32, 1, 5)                      # queue_name as i32
            + struct.pack(">bhq", TType.I64, 99, 7)                   # unknown field 99
            + struct.pack(">bhbi", TType.LIST, 2, TType.STRING, 1)
            + struct.pack(">i", 2) + b"ok" + b"\x00")
    reader = FrameReader(header + body)
    reader.read_message_begin()
    args = reader.read_struct(Kestrel.put_args())
    assert (args.queue_name, args.items, args.expiration_msec) == (None, [b"ok"], 0)


def test_bad_version_is_refused() -> None:
    """A strict header with a version other than 1 raises FrameError."""
    with pytest.raises(FrameError, match="bad protocol version"):
        FrameReader(struct.pack(">iI", -2147352575, 0) + b"\x00" * 8).read_message_begin()
