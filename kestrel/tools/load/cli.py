"""
The command line of C{kestrel-load}: one subcommand per load test, with the
flags and defaults of Kestrel 2.4's tools; L{main} runs one.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn, TextIO

from kestrel.tools.load.clients import LoadError, Output
from kestrel.tools.load.fleet import fleet
from kestrel.tools.load.scenarios import flood, leaky_reader, many_clients, packing, put_many

# -- command line


class _Parser(argparse.ArgumentParser):
    """An argument parser that exits with status 1 on bad usage, as Kestrel's tools did."""

    def error(self, message: str) -> NoReturn:
        """Print the usage and the problem, then exit 1."""
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _common(p: argparse.ArgumentParser, port: int = 22133, thrift: bool = True,
            monitor: bool = True) -> None:
    p.add_argument("--help", action="help", help="show this help and exit")
    p.add_argument("-h", dest="host", default="localhost", metavar="HOSTNAME",
                   help="use kestrel on HOSTNAME (default: %(default)s)")
    p.add_argument("-p", dest="port", type=int, default=None, metavar="PORT",
                   help=f"use kestrel on PORT (default: {port}; 2229 with --thrift)")
    if thrift:
        p.add_argument("--thrift", action="store_true", help="use thrift RPC")
    p.add_argument("-F", dest="flush", action="store_false",
                   help="don't flush queue(s) before the test")
    if monitor:
        p.add_argument("-M", dest="monitor", action="store_true",
                       help="monitor queue stats during the test")


def _items(p: argparse.ArgumentParser, default: int,
           help: str = "put ITEMS items into the queue") -> None:
    p.add_argument("-n", dest="items", type=int, default=default, metavar="ITEMS",
                   help=help + " (default: %(default)s)")


def _kilobytes(p: argparse.ArgumentParser) -> None:
    p.add_argument("-k", dest="kilobytes", type=int, default=1, metavar="KILOBYTES",
                   help="put KILOBYTES per queue item (default: %(default)s)")


def _queue(p: argparse.ArgumentParser, default: str = "spam",
           help: str = "use queue NAME") -> None:
    p.add_argument("-q", dest="queue", default=default, metavar="NAME",
                   help=help + " (default: %(default)s)")


def _count(p: argparse.ArgumentParser, flag: str, dest: str, metavar: str, help: str,
           default: int) -> None:
    """Add an option taking a count of at least 1."""
    p.add_argument(flag, dest=dest, type=_positive, default=default, metavar=metavar,
                   help=help + " (default: %(default)s)")


def _rollup(p: argparse.ArgumentParser, request: str) -> None:
    p.add_argument("-r", dest="rollup", type=_positive, default=1, metavar="ITEMS",
                   help="roll up ITEMS items into a single " + request)


def build_parser() -> argparse.ArgumentParser:
    """Return the C{kestrel-load} command-line parser (one subcommand per load test)."""
    parser = _Parser(prog="kestrel-load", add_help=False,
                     description="Kestrel's load tests against any Kestrel-compatible server.")
    parser.add_argument("--help", action="help", help="show this help and exit")
    sub = parser.add_subparsers(dest="test", required=True, parser_class=_Parser,
                                metavar="{flood,put-many,many-clients,leaky-reader,packing,fleet}")

    p = sub.add_parser("flood", add_help=False,
                       help="spin up a producer and consumer and flood N items through kestrel")
    _items(p, 10000)
    _kilobytes(p)
    _queue(p)
    p.add_argument("-P", dest="prefill", type=int, default=0, metavar="ITEMS",
                   help="prefill ITEMS items into the queue before the test (default: 0)")
    _count(p, "-R", "producers", "THREADS", "create THREADS producers", 1)
    _count(p, "-C", "consumers", "THREADS", "create THREADS consumers", 1)
    _rollup(p, "multi-put request (default: 1)")
    p.add_argument("-B", dest="blocking", action="store_true",
                   help="do blocking reads (reads with a timeout)")
    _common(p)
    p.set_defaults(run=flood)

    p = sub.add_parser("put-many", add_help=False, help="spam items into kestrel")
    _count(p, "-c", "clients", "CLIENTS", "use CLIENTS concurrent clients", 100)
    _items(p, 10000)
    p.add_argument("-b", dest="bytes", type=int, default=1024, metavar="BYTES",
                   help="put BYTES per queue item (default: %(default)s)")
    _rollup(p, "multi-put/multi-get request (default: 1)")
    _queue(p, help="use queue NAME as prefix")
    _count(p, "-Q", "queues", "QUEUES", "use QUEUES different queues", 1)
    p.add_argument("-g", dest="get", action="store_true", help="get the items afterwards")
    _common(p, monitor=False)
    p.set_defaults(run=put_many)

    p = sub.add_parser("many-clients", add_help=False,
                       help="N clients do timeout reads on a queue while one producer trickles")
    p.add_argument("-s", dest="sleep", type=int, default=100, metavar="MILLISECONDS",
                   help="sleep MILLISECONDS between puts (default: %(default)s)")
    _items(p, 100, "put ITEMS total items into the queue")
    _queue(p)
    _count(p, "-c", "clients", "CLIENTS", "use CLIENTS consumers", 100)
    p.add_argument("-k", dest="kill", type=int, default=0, metavar="PERCENT",
                   help="kill PERCENT %% of clients before they can read the response "
                        "(default: 0; implies -x)")
    p.add_argument("-x", dest="open_reads", action="store_true",
                   help="use open reads (get /close/open)")
    _common(p, thrift=False)
    p.set_defaults(run=many_clients, thrift=False)

    p = sub.add_parser("leaky-reader", add_help=False,
                       help="deliver N items through kestrel over thrift, with occasional drops")
    _items(p, 1000)
    p.add_argument("-d", dest="drop_rate", type=float, default=0.01, metavar="RATE",
                   help="drop RATE items (fraction, default: %(default)f)")
    _queue(p, "spam-thrift")
    _count(p, "-t", "threads", "THREADS", "create THREADS consumers", 1)
    p.add_argument("-a", dest="auto_abort", type=int, default=5000, metavar="MSEC",
                   help="auto-abort unconfirmed reads after MSEC (default: %(default)s)")
    p.add_argument("-v", dest="verbose", action="store_true",
                   help="be verbose, writing opens/confirms to stdout")
    _common(p, port=2229, thrift=False, monitor=False)
    p.set_defaults(run=leaky_reader, thrift=True)

    p = sub.add_parser("packing", add_help=False,
                       help="write N items, then do read/write cycles with pauses")
    _queue(p, help="use named queue")
    _items(p, 25000)
    _kilobytes(p)
    p.add_argument("-t", dest="pause", type=float, default=1, metavar="SECONDS",
                   help="pause SECONDS between cycles (default: 1)")
    p.add_argument("-c", dest="cycles", type=int, default=100, metavar="CYCLES",
                   help="do read/writes CYCLES times (default: %(default)s)")
    _common(p)
    p.set_defaults(run=packing)

    p = sub.add_parser("fleet", add_help=False,
                       help="producers and reliable consumers move N items through a fleet "
                            "with the fleet client")
    p.add_argument("--help", action="help", help="show this help and exit")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--servers", metavar="HOST:PORT,...",
                       help="a static list of memcache (or, with --thrift, thrift) endpoints")
    where.add_argument("--zookeeper", metavar="ZKHOST:PORT/PATH",
                       help="follow the server sets under PATH in ZooKeeper")
    _items(p, 10000, "move ITEMS items through the fleet")
    p.add_argument("-b", dest="bytes", type=int, default=1024, metavar="BYTES",
                   help="put BYTES per queue item (default: %(default)s)")
    _queue(p)
    _count(p, "-R", "producers", "PRODUCERS", "run PRODUCERS concurrent producers", 2)
    _count(p, "-C", "consumers", "CONSUMERS", "run CONSUMERS concurrent reliable consumers", 2)
    _rollup(p, "put (default: 1)")
    p.add_argument("-t", dest="timeout", type=float, default=300.0, metavar="SECONDS",
                   help="give up after SECONDS (default: %(default)s)")
    p.add_argument("--progress", type=float, default=5.0, metavar="SECONDS",
                   help="print progress every SECONDS (default: %(default)s)")
    p.add_argument("--thrift", action="store_true",
                   help="use thrift RPC (reliable reads with ids and auto-abort)")
    p.set_defaults(run=fleet, port=0)
    return parser


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None) -> int:
    """Run C{kestrel-load} with C{argv} (default: the command line); return the exit status."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.port is None:
        args.port = 2229 if args.thrift else 22133
    out = Output(stdout if stdout is not None else sys.stdout)
    try:
        return args.run(args, out)
    except LoadError as e:
        out(str(e))
        return 1
    finally:
        stop = getattr(args, "stop_monitor", None)
        if stop is not None:
            stop.set()

