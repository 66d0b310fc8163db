"""
Imported at start-up by every Python server that `benchmarks/instructions.py
--settle-rarely` counts (this folder is on its path after its code): its
histograms settle once in a million seconds instead of every second, so the
count per request leaves that work out.

Why: a server settles its histograms once a second, and the work of a
settle grows with the distinct values recorded since the last. Under
cachegrind a server serves some 40 times fewer requests a second than at
full speed, and their latencies spread over more distinct values, so each
request carries many times the share of settling it carries at full speed.
"""

import kestrel.metrics

kestrel.metrics.SETTLE_INTERVAL = 1e6
