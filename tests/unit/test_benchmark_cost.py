"""
The measuring parts of benchmarks/cost.py: CPU time from /proc/<pid>/stat
and system-call counts from an `strace -c` summary.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import cost  # noqa: E402

STRACE_SUMMARY = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 40.00    0.004000           1      4000           epoll_wait
 30.00    0.003000           1      4001         1 recvfrom
 20.00    0.002000           1      4000           sendto
 10.00    0.001000          50        20           fdatasync
------ ----------- ----------- --------- --------- ----------------
100.00    0.010000           0     12021         1 total
"""


def test_parse_strace_reads_calls_per_syscall_and_total() -> None:
    """Every syscall line and the total line give their call counts; headers are skipped."""
    assert cost.parse_strace(STRACE_SUMMARY) == {
        "epoll_wait": 4000, "recvfrom": 4001, "sendto": 4000, "fdatasync": 20, "total": 12021}


def test_result_per_request_and_per_fsync() -> None:
    """Counts are divided by requests (two per pair) and fsyncs by units."""
    result = cost.Result("db-1", "txkestrel", "pair", 2,
                         syscalls=cost.parse_strace(STRACE_SUMMARY), strace_units=2000)
    assert result.syscalls_per_request() == pytest.approx(12021 / 4000)
    assert result.top_syscalls(2) == [("recvfrom", 4001 / 4000), ("epoll_wait", 1.0)]
    assert result.units_per_fsync() == pytest.approx(100.0)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_cpu_seconds_follows_this_process() -> None:
    """utime + stime from /proc agrees with os.times() to within a few clock ticks."""
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    times = os.times()
    assert cost.cpu_seconds(os.getpid()) == pytest.approx(times.user + times.system,
                                                          abs=5 / cost.TICKS)
