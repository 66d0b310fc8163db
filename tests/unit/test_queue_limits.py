"""
max_queues and the file-descriptor budget: creating a queue past either is
refused with one error line on every protocol; existing queues work on.
"""

from __future__ import annotations

import resource
from pathlib import Path

from twisted.internet.task import Clock

from kestrel.errors import TooManyQueues
from kestrel.limits import queue_fd_budget, raise_open_file_limit
from kestrel.protocols.memcache import MemcacheFactory
from kestrel.protocols.text import TextFactory
from tests.support import StringClient, make_server

_REFUSED = (b"queue %s not created: the server holds max_queues (2) queues; "
            b"delete some or raise max_queues")


def test_max_queues_refuses_a_new_queue_only(clock: Clock, tmp_path: Path) -> None:
    """Past max_queues a new name is refused (memcache, meta, binary, text); old ones work."""
    server = make_server(clock, tmp_path, max_queues=2)
    try:
        conn = StringClient(MemcacheFactory(server))
        assert conn.send(b"set a 0 0 1\r\nx\r\nget b\r\n") == b"STORED\r\nEND\r\n"
        assert conn.send(b"get c\r\n") == b"SERVER_ERROR %s\r\n" % (_REFUSED % b"c")
        assert conn.send(b"ms c 1\r\ny\r\n") == b"SERVER_ERROR %s\r\n" % (_REFUSED % b"c")
        assert conn.send(b"set a 0 0 1\r\nz\r\nget a\r\n") == (
            b"STORED\r\nVALUE a 0 1\r\nx\r\nEND\r\n")
        text = StringClient(TextFactory(server))
        assert text.send(b"get d\n") == b"-%s\n" % (_REFUSED % b"d")
        assert server.collection.queue("c", create=False) is None
        assert not (tmp_path / "queues" / "c").exists()
        assert conn.send(b"delete b\r\nget c\r\n") == b"DELETED\r\nEND\r\n"
        assert conn.connected and text.connected
    finally:
        server.collection.stopService()


def test_too_many_queues_is_a_one_line_reply() -> None:
    """The error names the queue and the limit, on one line."""
    error = TooManyQueues("q", "the server holds max_queues (5) queues")
    assert str(error) == "queue q not created: the server holds max_queues (5) queues"
    assert "\n" not in str(error)


def test_fd_budget_is_half_the_soft_limit() -> None:
    """Queues may hold half of the soft RLIMIT_NOFILE; the start raises soft to hard."""
    soft, hard = raise_open_file_limit()
    assert hard == resource.RLIM_INFINITY or soft == hard
    assert queue_fd_budget() == (1 << 29 if soft == resource.RLIM_INFINITY else soft // 2)
