"""
The measuring parts of benchmarks/cost.py: CPU time from /proc/<pid>/stat,
system-call counts from an `strace -c` summary, the journal-floor server's
records and report.py's reading of the floors.
"""

from __future__ import annotations

import os
import platform
import shlex
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
from twisted.internet.task import Clock

from kestrel.journal import records as rec
from kestrel.journal.journal import FileJournal

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import cost  # noqa: E402
import report  # noqa: E402
import servers  # noqa: E402
from servers import floor_process, free_port  # noqa: E402

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
def test_cpu_times_follow_this_process() -> None:
    """utime and stime from /proc agree with os.times() to within a few clock ticks."""
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        os.stat("/")  # (some system time too)
    times = os.times()
    user, system = cost.cpu_times(os.getpid())
    tick = os.sysconf("SC_CLK_TCK")
    assert user == pytest.approx(times.user, abs=5 / tick)
    assert system == pytest.approx(times.system, abs=5 / tick)


def test_journal_floor_writes_records_that_replay(tmp_path: Path) -> None:
    """
    The journal-floor server (floor_server.py --journal) journals in
    Kestrel's format: what it wrote for a set, a hit and a miss replays as
    ADDX then REMOVE, nothing for the miss.
    """
    port = free_port()
    journal_dir = tmp_path / "journal"
    with floor_process(port, "kestrel", journal_dir), \
            socket.create_connection(("127.0.0.1", port)) as sock:
        replies = b""
        sock.sendall(b"set q 0 0 5\r\nhello\r\nget q\r\nget q\r\n")
        while not replies.endswith(b"END\r\nEND\r\n"):
            replies += sock.recv(65536)
    assert replies == b"STORED\r\nVALUE q 0 5\r\nhello\r\nEND\r\nEND\r\n"
    assert os.listdir(journal_dir) == [b"q".hex()]
    records = _replayed_q(journal_dir)
    assert [type(r) for r in records] == [rec.Add, rec.Remove]
    assert records[0].data == b"hello"


def _exchange(sock: socket.socket, request: bytes, replies_end: bytes) -> bytes:
    sock.sendall(request)
    replies = b""
    while not replies.endswith(replies_end):
        replies += sock.recv(65536)
    return replies


def _first_hit(port: int, seconds: float = 10.0) -> bytes:
    """
    The reply to C{get q} on a new connection, asked again while it is END
    (an item given back by a connection the server has not yet seen go),
    for at most C{seconds}.
    """
    deadline = time.monotonic() + seconds
    while True:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            replies = _exchange(sock, b"get q\r\n", b"END\r\n")
        if replies != b"END\r\n" or time.monotonic() > deadline:
            return replies


def _replayed_q(journal_dir: Path) -> list[rec.Record]:
    """The records of the floor's one journal file in C{journal_dir}, replayed as queue q's."""
    (name,) = os.listdir(journal_dir)
    (journal_dir / name).rename(journal_dir / "q")
    records: list[rec.Record] = []
    FileJournal(str(journal_dir), "q", Clock(), None).replay(records.append)
    return records


@pytest.mark.parametrize("reactor", ["kestrel", "none"])
def test_floor_reliable_read_opens_closes_and_gives_back(tmp_path: Path, reactor: str) -> None:
    """
    The floor servers answer Kestrel's reliable read as cost.py's reliable-1
    asks it: C{/open} hands out the head and holds it (one per queue and
    connection), C{/close} removes it for good, and what a connection that
    has gone held open is back at the head. The journal floor writes an
    open and a confirm record that replay.
    """
    port = free_port()
    journal_dir = tmp_path / "journal"
    with floor_process(port, reactor, journal_dir):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            replies = _exchange(sock, b"set q 0 0 1\r\na\r\nset q 0 0 1\r\nb\r\n"
                                      b"get q/open\r\nget q/open\r\nget q/close\r\n"
                                      b"get q/close\r\nget q/open\r\n",
                                b"VALUE q/open 0 1\r\nb\r\nEND\r\n")
        assert replies == (b"STORED\r\nSTORED\r\nVALUE q/open 0 1\r\na\r\nEND\r\nEND\r\n"
                           b"END\r\nEND\r\nVALUE q/open 0 1\r\nb\r\nEND\r\n")
        # (b was open on the connection that has gone: back at the head)
        replies = _first_hit(port)
        assert replies == b"VALUE q 0 1\r\nb\r\nEND\r\n"
    records = _replayed_q(journal_dir)
    assert [type(r) for r in records] == [rec.Add, rec.Add, rec.RemoveTentativeXid,
                                          rec.ConfirmRemove, rec.RemoveTentativeXid, rec.Remove]
    assert records[2].xid == records[3].xid != records[4].xid


def test_bookkeeping_floor_answers_after_the_fsync_with_items_that_replay(
        tmp_path: Path) -> None:
    """
    The bookkeeping floor (floor_server.py --durable --bookkeeping) stores
    what it acknowledges: each set is answered STORED, seen by no reader
    before the fsync of its turn, served by a later get in order, and
    journaled as an ADDX record carrying its add time and expiry (each hit
    as a REMOVE). A queue name txkestrel refuses is refused here too: the
    connection closes, the server lives on.
    """
    port = free_port()
    journal_dir = tmp_path / "journal"
    before_ms = int(time.time() * 1000)
    with floor_process(port, "kestrel", journal_dir, durable=True, bookkeeping=True):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            assert _exchange(sock, b"set q 0 0 5\r\nhello\r\n", b"\r\n") == b"STORED\r\n"
            # (unseen until the turn's fsync: not even by a get in the same turn)
            assert _exchange(sock, b"set q 0 60 2\r\nhi\r\nget q\r\nget q\r\n",
                             b"END\r\nEND\r\n") == (
                b"STORED\r\nVALUE q 0 5\r\nhello\r\nEND\r\nEND\r\n")
            assert _exchange(sock, b"get q\r\n", b"END\r\n") == b"VALUE q 0 2\r\nhi\r\nEND\r\n"
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"set a/b 0 0 1\r\nx\r\n")
            assert sock.recv(65536) == b""
        with socket.create_connection(("127.0.0.1", port)) as sock:
            assert _exchange(sock, b"get q\r\n", b"END\r\n") == b"END\r\n"
    records = _replayed_q(journal_dir)
    assert [type(r) for r in records] == [rec.Add, rec.Add, rec.Remove, rec.Remove]
    first, second = records[:2]
    assert isinstance(first, rec.Add) and isinstance(second, rec.Add)
    assert (first.data, first.expiry_ms) == (b"hello", 0)
    assert second.data == b"hi"
    assert before_ms <= first.add_time_ms <= second.add_time_ms <= int(time.time() * 1000)
    assert second.expiry_ms == second.add_time_ms + 60_000


def test_bookkeeping_floor_serves_reads_with_kestrels_books(tmp_path: Path) -> None:
    """
    Without --durable, the bookkeeping floor (floor_server.py --journal
    --bookkeeping) serves cost.py's one-request-at-a-time workloads with
    Kestrel's books: a set is seen at once; a get discards an expired head
    item (journaled as a REMOVE) and hands out the next; C{/open} holds the
    head (one per queue and connection) and C{/close} confirms it; what a
    connection that has gone held open is back at the head. Every request
    is journaled in records that replay.
    """
    port = free_port()
    journal_dir = tmp_path / "journal"
    with floor_process(port, "kestrel", journal_dir, bookkeeping=True):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            replies = _exchange(sock, b"set q 0 -1 4\r\ngone\r\nset q 0 0 1\r\na\r\n"
                                      b"set q 0 0 1\r\nb\r\nset q 0 0 1\r\nc\r\nget q\r\n"
                                      b"get q/open\r\nget q/open\r\nget q/close\r\n"
                                      b"get q/open\r\n",
                                b"VALUE q/open 0 1\r\nc\r\nEND\r\n")
        assert replies == (b"STORED\r\n" * 4 + b"VALUE q 0 1\r\na\r\nEND\r\n"
                           b"VALUE q/open 0 1\r\nb\r\nEND\r\nEND\r\nEND\r\n"
                           b"VALUE q/open 0 1\r\nc\r\nEND\r\n")
        # (c was open on the connection that has gone: back at the head)
        replies = _first_hit(port)
        assert replies == b"VALUE q 0 1\r\nc\r\nEND\r\n"
        with socket.create_connection(("127.0.0.1", port)) as sock:
            assert _exchange(sock, b"get q\r\n", b"END\r\n") == b"END\r\n"
    records = _replayed_q(journal_dir)
    assert [type(r) for r in records] == [rec.Add] * 4 + [
        rec.Remove, rec.Remove, rec.RemoveTentativeXid, rec.ConfirmRemove,
        rec.RemoveTentativeXid, rec.Remove]
    assert [r.data for r in records[:4] if isinstance(r, rec.Add)] == [b"gone", b"a", b"b", b"c"]
    assert records[6].xid == records[7].xid != records[8].xid


def test_report_reads_both_floors() -> None:
    """report.py says what share of txkestrel's CPU each floor server costs."""

    def row(server: str, cpu: float) -> dict[str, object]:
        return {"server": server, "unit": "pair", "cpu_us": {"median": cpu}}

    text = "\n".join(report.floor_reading({"db-1": [
        row("txkestrel", 90.0), row("twisted-floor", 45.0), row("journal-floor", 54.0)]}))
    assert "45.0 of txkestrel's 90.0 us per pair (50%)" in text
    assert "54.0 against txkestrel's 90.0 us per pair" in text
    assert report.floor_reading({"db-1": [row("txkestrel", 90.0)]}) == []


def test_report_reads_the_durable_floors_against_redis() -> None:
    """report.py gives, per durable workload, each durable floor's and txkestrel's cost."""

    def row(server: str, cpu: float) -> dict[str, object]:
        return {"server": server, "unit": "set", "cpu_us": {"median": cpu}}

    text = "\n".join(report.floor_reading({"durable-50": [
        row("txkestrel", 22.5), row("redis", 12.5), row("durable-floor", 15.0),
        row("bookkeeping-floor", 18.0)]}))
    assert ("durable-50: Redis 12.5, durable-floor 15.0 (1.20x), bookkeeping-floor 18.0 "
            "(1.44x), txkestrel 22.5 (1.80x)") in text
    without_redis = "\n".join(report.floor_reading({"durable-10": [
        row("txkestrel", 30.0), row("bookkeeping-floor", 24.0)]}))
    assert "durable-10: bookkeeping-floor 24.0, txkestrel 30.0." in without_redis
    assert report.floor_reading({"durable-50": [row("txkestrel", 22.5),
                                                row("redis", 12.5)]}) == []


def test_report_reads_the_bookkeeping_floor_against_each_targets_peer() -> None:
    """
    One request at a time, report.py gives the bookkeeping floor's and
    txkestrel's cost against the peer of the target: Redis per pair,
    beanstalkd per reliable item.
    """

    def row(server: str, unit: str, cpu: float) -> dict[str, object]:
        return {"server": server, "unit": unit, "cpu_us": {"median": cpu}}

    text = "\n".join(report.floor_reading({
        "dequeue-1": [row("txkestrel", "pair", 90.0), row("redis", "pair", 50.0),
                      row("beanstalkd", "pair", 80.0), row("bookkeeping-floor", "pair", 70.0)],
        "reliable-1": [row("txkestrel", "item", 140.0), row("redis", "item", 90.0),
                       row("beanstalkd", "item", 80.0),
                       row("bookkeeping-floor", "item", 100.0)]}))
    assert ("dequeue-1, per pair: Redis 50.0, bookkeeping-floor 70.0 (1.40x), txkestrel 90.0 "
            "(1.80x); reliable-1, per item: beanstalkd 80.0, bookkeeping-floor 100.0 (1.25x), "
            "txkestrel 140.0 (1.75x).") in text
    alone = "\n".join(report.floor_reading({"dequeue-1": [
        row("txkestrel", "pair", 90.0), row("bookkeeping-floor", "pair", 70.0)]}))
    assert "dequeue-1, per pair: bookkeeping-floor 70.0, txkestrel 90.0." in alone


def test_instructions_counts_the_floors_of_each_workload() -> None:
    """
    instructions.py --floors counts the durable and bookkeeping floors in
    durable-N, and the journal and bookkeeping floors one request at a time.
    """
    import instructions

    args = instructions.parse_args(["--floors", "--redis", ""])
    names = {name: [s.name for s in instructions.candidates(args, instructions.workload(
        name, 1024))] for name in ("durable-50", "dequeue-1", "reliable-1")}
    assert names == {"durable-50": ["txkestrel", "durable-floor", "bookkeeping-floor"],
                     "dequeue-1": ["txkestrel", "journal-floor", "bookkeeping-floor"],
                     "reliable-1": ["txkestrel", "journal-floor", "bookkeeping-floor"]}


def test_instructions_reports_ratios_against_txkestrel_and_redis() -> None:
    import instructions

    work = instructions.workload("durable-50", 1024)
    lines = instructions.report(work, {"txkestrel": [80_000.0], "redis": [9_000.0, 10_000.0,
                                                                        12_000.0],
                                       "durable-floor": [30_000.0]})
    assert lines[:4] == ["### durable-50", "", "| server | instructions per set | vs txkestrel "
                         "| vs redis |", "|---|---|---|---|"]
    assert lines[4:7] == ["| txkestrel | 80,000 | 1.00x | 8.00x |",
                          "| redis | 10,000 (9,000-12,000) | 0.12x | 1.00x |",
                          "| durable-floor | 30,000 | 0.38x | 3.00x |"]
    pairs = instructions.report(instructions.workload("dequeue-1", 10), {"txkestrel": [5.0]})
    assert pairs[2].startswith("| server | instructions per pair")
    items = instructions.report(instructions.workload("reliable-1", 10), {"txkestrel": [5.0]})
    assert items[2].startswith("| server | instructions per item")
    with pytest.raises(SystemExit, match="unknown workload"):
        instructions.workload("durable", 1024)


def test_instructions_counts_what_a_server_runs_per_request(tmp_path: Path) -> None:
    """
    Under cachegrind, the durable floor serving 600 sets more than another
    run executes some thousands of instructions per set more: start-up and
    shutdown cancel out.
    """
    import instructions

    args = instructions.parse_args(["--floors", "--redis", "", "--warm", "100",
                                    "--requests", "600"])
    work = instructions.workload("durable-5", 1024)
    floor = next(s for s in instructions.candidates(args, work) if s.name == "durable-floor")
    per_set = instructions.per_request(floor, work, args)
    assert 5_000 < per_set < 200_000


def test_settle_rarely_reaches_the_servers_own_metrics() -> None:
    """
    C{--settle-rarely} puts its folder after a Python server's code on the
    server's path: that server's histograms settle once in 10^6 s; a server
    started after it is reset settles every second, as it always does.
    """
    import instructions
    import servers

    def settle_interval() -> float:
        env = servers.python_env(servers.ROOT)
        out = subprocess.run([sys.executable, "-c",
                              "import kestrel.metrics; print(kestrel.metrics.SETTLE_INTERVAL)"],
                             env=env, cwd=servers.ROOT, capture_output=True, check=True)
        return float(out.stdout)

    servers.python_path_after([str(instructions.SETTLE_RARELY)])
    try:
        assert servers.python_env(servers.ROOT)["PYTHONPATH"].split(os.pathsep) == [
            str(servers.ROOT), str(instructions.SETTLE_RARELY)]
        assert settle_interval() == 1e6
    finally:
        servers.python_path_after([])
    assert settle_interval() == 1.0


def _noting_python(folder: Path, name: str) -> tuple[str, Path]:
    """
    An interpreter (a shell script) that notes the folder it starts in and
    its arguments, a line per start, in the file returned, then runs as
    this one.
    """
    notes = folder / f"{name}.starts"
    script = folder / name
    script.write_text(f'#!/bin/sh\necho "$PWD $*" >> {shlex.quote(str(notes))}\n'
                      f'exec {shlex.quote(sys.executable)} "$@"\n')
    script.chmod(0o755)
    return str(script), notes


def test_describe_python_names_the_version_and_what_runs_or_why_not(tmp_path: Path) -> None:
    """
    An interpreter is described by its version and the interpreter it runs
    (a venv's base); one that is missing, or that cannot import txkestrel's
    dependencies, is refused with the reason.
    """
    assert servers.describe_python(sys.executable) == (
        f"{platform.python_version()} ({getattr(sys, '_base_executable', sys.executable)})")
    with pytest.raises(RuntimeError, match="No such file"):
        servers.describe_python(str(tmp_path / "missing"))
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    with pytest.raises(RuntimeError, match="cannot run txkestrel .*No module named 'twisted"):
        servers.describe_python(str(bare / "bin" / "python"))


def test_python_servers_start_on_the_interpreter_chosen(tmp_path: Path) -> None:
    """
    After use_python, the floor server starts on that interpreter, and
    txkestrel too unless its start names another.
    """
    chosen, chosen_starts = _noting_python(tmp_path, "chosen")
    other, other_starts = _noting_python(tmp_path, "other")
    servers.use_python(chosen)
    try:
        with floor_process(free_port()):
            pass
        with servers.kestrel_process(tmp_path / "k", free_port(), python=other):
            pass
        with servers.kestrel_process(tmp_path / "k2", free_port()):
            pass
    finally:
        servers.use_python(sys.executable)
    chosen_lines = chosen_starts.read_text().splitlines()
    assert len(chosen_lines) == 2
    assert "floor_server.py" in chosen_lines[0] and "kestrel --config" in chosen_lines[1]
    assert "kestrel --config" in other_starts.read_text()


def test_cost_runs_this_checkout_on_the_baseline_python(tmp_path: Path) -> None:
    """
    cost.py --baseline-python without --baseline-src runs a second
    txkestrel, txkestrel-before, from this checkout on that interpreter;
    the first runs on --python's.
    """
    other, starts = _noting_python(tmp_path, "other")
    args = cost.parse_args(["--baseline-python", other, "--only", "dequeue-1",
                            "--memcached", "", "--redis", "", "--beanstalkd", ""])
    described = servers.describe_python(sys.executable)
    assert args.interpreters == {"server_python": described, "baseline_python": described}
    assert cost.parse_args(["--memcached", "", "--redis", "", "--beanstalkd", ""]
                           ).interpreters == {}
    assert cost.parse_args(["--python", other, "--memcached", "", "--redis", "",
                            "--beanstalkd", ""]).interpreters == {"server_python": described}
    before = starts.read_text()  # (the check that it runs txkestrel)
    with ExitStack() as stack:
        plain, durable = cost.start_servers(args, cost.workloads(args), tmp_path / "root", stack)
        assert [s.name for s in plain] == ["txkestrel", "txkestrel-before"] and not durable
    started = starts.read_text()[len(before):].splitlines()
    assert len(started) == 1
    assert started[0].startswith(f"{servers.ROOT} -m twisted") and "txkestrel-before" in started[0]
    with pytest.raises(SystemExit):
        cost.parse_args(["--baseline-python", str(tmp_path / "missing")])


def test_reports_name_the_interpreters_a_run_chose() -> None:
    """
    The header names the clients' Python alone, or with the Python servers'
    and txkestrel-before's when a run chose them; a printed command names
    them by variable.
    """
    assert cost.pythons_ran({"python": "3.11.7"}) == "Python 3.11.7"
    assert cost.pythons_ran({"python": "3.11.7", "server_python": "3.11.2 (/usr/bin/python3.11)",
                             "baseline_python": "3.11.7 (/opt/py/bin/python3.11)"}) == (
        "Python 3.11.7 (clients); Python servers on 3.11.2 (/usr/bin/python3.11), "
        "txkestrel-before on 3.11.7 (/opt/py/bin/python3.11)")
    assert report.public_command(
        "python3 benchmarks/cost.py --python /a/bin/python --baseline-python /b/bin/python "
        "--runs 5") == ("python3 benchmarks/cost.py --python $SERVER_PYTHON --baseline-python "
                        "$BASELINE_PYTHON --runs 5")


def test_instructions_counts_this_checkout_on_the_baseline_python() -> None:
    """instructions.py --baseline-python alone counts txkestrel-before too."""
    import instructions

    args = instructions.parse_args(["--baseline-python", sys.executable, "--redis", ""])
    assert [s.name for s in instructions.candidates(args, instructions.workload(
        "durable-50", 1024))] == ["txkestrel", "txkestrel-before"]
