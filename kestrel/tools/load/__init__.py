"""
C{kestrel-load}: Kestrel's load tests (flood, put-many, many-clients, leaky-reader, packing),
and C{fleet}, which drives a fleet of servers through L{kestrel.client}.

Each subcommand takes the flags and defaults of Kestrel 2.4's tool of the
same name, talks to any Kestrel-compatible server over memcache (or thrift
with C{--thrift}, where Kestrel's tool could), prints Kestrel's summary
lines, and adds latency percentiles (p50/p90/p99/p999, microseconds) measured
per request. Replies are checked byte for byte (memcache) or value for value
(thrift), and item order where Kestrel's tool checked it; a wrong reply
stops the run with Kestrel's "Unexpected response" message and exit status 1.

Clients are plain blocking sockets in threads, one connection per simulated
client, as Kestrel's tools were; see C{docs/load-tests.md} for what that
means for the figures.

The package: L{kestrel.tools.load.clients} (blocking connections, requests,
threads and timing), L{kestrel.tools.load.scenarios} (Kestrel's load tests),
L{kestrel.tools.load.fleet} (the fleet run) and L{kestrel.tools.load.cli}
(the subcommands and L{main}, the C{kestrel-load} entry point).
"""

from kestrel.tools.load.cli import build_parser, main

__all__ = ["build_parser", "main"]
