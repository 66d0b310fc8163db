"""
The least a Twisted memcache queue server costs per request on this machine.

Not part of the server, and not a benchmark by itself: `benchmarks/cost.py
--floor` runs it beside txkestrel as the server "twisted-floor", to show how
much of txkestrel's CPU per request is the reactor's and the kernel's socket
work, which no change inside txkestrel's protocol or queue code can remove.
It answers `set <q> <flags> <exptime> <bytes>` with STORED and `get <q>` with
the oldest item of an in-memory FIFO (or END), one request per line, using
the same reply path as txkestrel (`kestrel.protocols.base.write_now`) and the
same reactor (`kestrel.reactor`; `--reactor epoll` for Twisted's own, run by
`cost.py --epoll` as "twisted-floor-epoll"). No journal, no metrics, no
sessions: do not use it for anything else.

    python3 benchmarks/floor_server.py [--reactor kestrel|epoll] PORT
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict, deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from twisted.internet.protocol import Factory, Protocol  # noqa: E402

from kestrel.protocols.base import write_now  # noqa: E402

QUEUES: defaultdict[bytes, deque[bytes]] = defaultdict(deque)


class FloorProtocol(Protocol):
    """Serve every complete set/get in the buffer; one write of all replies."""

    def __init__(self) -> None:
        self.buf = b""

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted hook
        """Parse and answer what is complete; keep the rest."""
        buf = self.buf + data if self.buf else data
        out = []
        pos = 0
        while True:
            nl = buf.find(b"\r\n", pos)
            if nl < 0:
                break
            words = buf[pos:nl].split()
            if words and words[0] == b"set" and len(words) >= 5:
                end = nl + 2 + int(words[4])
                if len(buf) < end + 2:
                    break
                QUEUES[words[1]].append(buf[nl + 2:end])
                out.append(b"STORED\r\n")
                pos = end + 2
            elif words and words[0] == b"get" and len(words) >= 2:
                q = QUEUES.get(words[1])
                if q:
                    item = q.popleft()
                    out.append(b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (words[1], len(item), item))
                else:
                    out.append(b"END\r\n")
                pos = nl + 2
            else:
                out.append(b"ERROR\r\n")
                pos = nl + 2
        self.buf = buf[pos:]
        if out:
            write_now(self.transport, out[0] if len(out) == 1 else b"".join(out))


def main() -> None:
    """Listen on the loopback port given until stopped."""
    parser = argparse.ArgumentParser(
        description="A bare Twisted memcache queue (set/get, in memory, no journal): the "
                    "floor of what a Twisted server costs per request. For benchmarks only.")
    parser.add_argument("port", type=int, help="loopback TCP port to listen on")
    parser.add_argument("--reactor", choices=["kestrel", "epoll"], default="kestrel",
                        help="txkestrel's reactor (kestrel.reactor) or Twisted's epoll reactor")
    args = parser.parse_args()
    if args.reactor == "kestrel":
        from kestrel.reactor import install

        install()
    from twisted.internet import reactor

    factory = Factory.forProtocol(FloorProtocol)
    reactor.listenTCP(args.port, factory, interface="127.0.0.1")  # type: ignore[attr-defined]
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
