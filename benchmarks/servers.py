"""
Servers for the benchmarks: txkestrel, memcached, darner, Redis and
beanstalkd as child processes on free ports.

Shared by `benchmarks/flood.py`, `benchmarks/thrift_flood.py`,
`benchmarks/cost.py`, `benchmarks/fleet.py`, `benchmarks/restart.py`,
`benchmarks/rewrite_latency.py` and `benchmarks/hostile_memory.py`
(`cpu_seconds`); not a benchmark itself. Every server listens on loopback
(darner, which has no bind option, on every address) and is stopped (SIGTERM,
then SIGKILL after 30 s) when its context ends. Each context yields the
server's process, whose pid is what `/proc/<pid>/stat` is read for.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The CPUs every server started here runs on (C{None}: wherever the OS puts
#: it); L{pin_servers} sets it. Pinned servers and a client pinned to other
#: CPUs make CPU-per-request figures comparable: on a 2-core machine an
#: unpinned pair costs about twice as much whenever the OS puts both on the
#: same core as when it keeps them apart, and it switches between the two.
SERVER_CPUS: set[int] | None = None


def pin_servers(cpus: set[int] | None) -> None:
    """Run every server started from now on on C{cpus} only (C{None}: anywhere)."""
    global SERVER_CPUS
    SERVER_CPUS = cpus


#: Seconds a server may take to start listening, unless L{run_under} says otherwise.
DEFAULT_START_TIMEOUT = 30.0

#: What every server started from now on runs under (a command and its
#: options, e.g. valgrind's), and how many seconds it may take to listen;
#: L{run_under} sets them.
COMMAND_PREFIX: list[str] = []
START_TIMEOUT = DEFAULT_START_TIMEOUT


def run_under(prefix: list[str], start_timeout: float = DEFAULT_START_TIMEOUT) -> None:
    """Start every server from now on as C{prefix + command} (C{[]}: as itself)."""
    global COMMAND_PREFIX, START_TIMEOUT
    COMMAND_PREFIX = list(prefix)
    START_TIMEOUT = start_timeout


def cachegrind_prefix(valgrind: str, folder: Path) -> list[str]:
    """
    The command prefix that runs a server under valgrind's cachegrind
    (instructions only, no cache simulation), its output and log in C{folder}.
    """
    return [valgrind, "--tool=cachegrind", "--cache-sim=no",
            f"--cachegrind-out-file={folder / 'cachegrind.out'}",
            f"--log-file={folder / 'cachegrind.log'}"]


def cachegrind_count(folder: Path) -> int:
    """
    The instructions a server run under L{cachegrind_prefix} with C{folder}
    executed in user space, from start to exit (its log's C{I refs}).
    """
    log = folder / "cachegrind.log"
    found = re.search(r"I\s+refs:\s+([\d,]+)", log.read_text())
    if found is None:
        raise RuntimeError(f"no instruction count in {log}:\n{log.read_text()[-2000:]}")
    return int(found.group(1).replace(",", ""))


#: Folders put after the server's own code on the C{PYTHONPATH} of every
#: Python server started from now on (e.g. one holding a C{sitecustomize});
#: L{python_path_after} sets them.
PYTHON_PATH_AFTER: list[str] = []


def python_path_after(folders: list[str]) -> None:
    """Put C{folders} after its code on the path of every Python server from now on."""
    global PYTHON_PATH_AFTER
    PYTHON_PATH_AFTER = list(folders)


#: The interpreter of every Python server (txkestrel, the floors) started
#: from now on, unless its start names another: the one running the
#: benchmark, or the one L{use_python} chose.
SERVER_PYTHON = sys.executable

#: What a server's interpreter must import to run txkestrel and the floors.
_NEEDED = "import twisted.internet, yaml, thriftpy2, zope.interface"


def use_python(executable: str) -> None:
    """Run every Python server started from now on with C{executable}."""
    global SERVER_PYTHON
    SERVER_PYTHON = executable


def add_python_options(parser: argparse.ArgumentParser, baseline: bool = True) -> None:
    """
    Give C{parser} C{--python} (the Python servers' interpreter, by default
    the one running the benchmark) and, with C{baseline}, C{--baseline-python}
    (txkestrel-before's); L{interpreters_named} checks what they name.
    """
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter of the Python servers (txkestrel, and the floors "
                             "where they run): the python of a venv that has txkestrel's "
                             "dependencies (`pip install .`), e.g. one made with Debian's "
                             "/usr/bin/python3.11 (default: the one running this script)")
    if baseline:
        parser.add_argument("--baseline-python",
                            help="also run txkestrel-before (this checkout, or --baseline-src) "
                                 "on this interpreter instead of --python's: the same code on "
                                 "two interpreters, side by side")


def describe_python(executable: str) -> str:
    """
    C{executable}'s version and the interpreter it runs (a venv's base), as
    reports print it: C{"3.11.2 (/usr/bin/python3.11)"}. Raises
    C{RuntimeError}, saying why, if it cannot run txkestrel (it is missing,
    or lacks a dependency: make a venv with it and C{pip install .}).
    """
    probe = (f"{_NEEDED}; import platform, sys; "
             "print(platform.python_version(), getattr(sys, '_base_executable', sys.executable))")
    try:
        done = subprocess.run([executable, "-c", probe], capture_output=True, text=True,
                              timeout=60, cwd="/")  # (not beside a folder named twisted)
    except OSError as e:
        raise RuntimeError(f"{executable}: {e.strerror}") from e
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise RuntimeError(f"{executable} cannot run txkestrel ({last}): make a venv with it "
                           f"and pip install . into it")
    version, base = done.stdout.split(maxsplit=1)
    return f"{version} ({base.strip()})"


def interpreters_named(python: str, baseline_python: str | None) -> dict[str, str]:
    """
    Check that C{python} (the Python servers') and C{baseline_python}, if
    given (txkestrel-before's), run txkestrel (L{describe_python}'s
    C{RuntimeError} if not); return what a report names: nothing when the
    servers run on the interpreter running the benchmark, else
    C{server_python} and, given, C{baseline_python}, each described.
    """
    described = describe_python(python)
    if baseline_python:
        return {"server_python": described, "baseline_python": describe_python(baseline_python)}
    return {} if python == sys.executable else {"server_python": described}


def python_env(src: Path) -> dict[str, str]:
    """The environment of a Python server whose code is at C{src} (and L{PYTHON_PATH_AFTER})."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), *PYTHON_PATH_AFTER])}


def _popen(args: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
    """C{subprocess.Popen} of a server, on L{SERVER_CPUS}, under L{COMMAND_PREFIX}."""
    return subprocess.Popen([*COMMAND_PREFIX, *args], preexec_fn=_on_server_cpus,
                            **kwargs)  # type: ignore[call-overload]


def _on_server_cpus() -> None:
    """In a server's child process before it runs: keep it (and its threads) on L{SERVER_CPUS}."""
    if SERVER_CPUS is not None:
        os.sched_setaffinity(0, SERVER_CPUS)


#: How many ports below the kernel's ephemeral range L{free_port} draws from.
PORT_SPAN = 12000
#: Ports L{free_port} never hands out: the servers' own defaults (kestrel's memcache
#: port, and darner's, is 22133).
KNOWN_PORTS = frozenset({22133})
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 when it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """
    Return a loopback TCP port that was free a moment ago, and that this module
    has not handed out before (a process that imports it both as C{servers} and
    as C{benchmarks.servers} holds two such memories).

    The port is drawn at random from just below the kernel's ephemeral range, so
    that no outgoing connection's local port (which the kernel draws from that
    range) can take it between this call and the server's C{listen}: a port from
    C{bind(0)} is an ephemeral one, and a busy test suite's clients took one
    back before its server bound it.
    """
    high = _ephemeral_low()
    low = max(1024, high - PORT_SPAN)
    for _ in range(200):
        port = random.randrange(low, high)
        if port in _handed_out or port in KNOWN_PORTS:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {low}-{high - 1}")


def wait_port(port: int, proc: subprocess.Popen[bytes],
              timeout: float = DEFAULT_START_TIMEOUT) -> None:
    """Return once C{port} accepts connections; raise if C{proc} dies or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port} after {timeout}s")


def cpu_seconds(pid: int) -> float:
    """utime + stime of process C{pid}, in seconds (from C{/proc/<pid>/stat})."""
    return sum(cpu_times(pid))


def cpu_times(pid: int) -> tuple[float, float]:
    """(utime, stime) of process C{pid} (every thread), in seconds (from C{/proc/<pid>/stat})."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop C{proc} with SIGTERM (SIGKILL if it is still there after 30 s) and reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def serving(proc: subprocess.Popen[bytes], *ports: int) -> Iterator[None]:
    """Enter once every one of C{ports} accepts connections; stop C{proc} on the way out."""
    try:
        for port in ports:
            wait_port(port, proc, START_TIMEOUT)
        yield
    finally:
        stop(proc)


@contextmanager
def kestrel_process(workdir: Path, memcache_port: int, thrift_port: int = 0,
                    extra_config: str = "", src: Path = ROOT, reactor: str | None = None,
                    python: str | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """
    Run our server (`python -m twisted kestrel`) with its journals under C{workdir}.

    It listens on C{memcache_port} and, unless 0, C{thrift_port} (text and
    admin are off); C{extra_config} is more YAML lines; the code is the
    checkout at C{src} (this one by default); C{reactor}, if given, is
    passed as C{--reactor} (e.g. C{"epoll"}: Twisted's own instead of
    txkestrel's); C{python}, if given, is its interpreter instead of
    L{SERVER_PYTHON}. The context is entered once
    every port accepts connections; the log is C{workdir/kestrel.log}.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "kestrel.yaml"
    config.write_text(
        f"listen_address: 127.0.0.1\nmemcache_port: {memcache_port}\ntext_port: 0\n"
        f"thrift_port: {thrift_port}\nadmin_port: 0\n{extra_config}"
        f"queue_path: {workdir / 'queues'}\nstatus_file: {workdir / 'status'}\n"
    )
    env = python_env(src)
    with open(workdir / "kestrel.log", "wb") as log:
        chosen = ["--reactor", reactor] if reactor else []
        proc = _popen([python or SERVER_PYTHON, "-m", "twisted", "--log-format=text", *chosen,
                                 "kestrel", "--config", str(config)], cwd=src, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    with serving(proc, *(port for port in (thrift_port, memcache_port) if port)):
        yield proc


@contextmanager
def memcached_process(binary: str, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """Debian's memcached on loopback C{port} (C{-m 256 -c 1024}, no UDP)."""
    command = [binary, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", "256", "-c", "1024"]
    if os.geteuid() == 0:
        command += ["-u", "nobody"]  # memcached refuses to run as root without -u
    proc = _popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with serving(proc, port):
        yield proc


@contextmanager
def darner_process(binary: str, port: int, datadir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """
    darner (a C++ Kestrel clone, built separately) on C{port}, its LevelDB in C{datadir}.

    darner fsyncs only the writes to a queue named with a C{/sync} suffix.
    Never send it C{flush_all}: darner 0.2.0 crashes on it.
    """
    datadir.mkdir(parents=True, exist_ok=True)
    proc = _popen([binary, "-p", str(port), "-d", str(datadir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with serving(proc, port):
        yield proc


@contextmanager
def redis_process(binary: str, port: int, datadir: Path, fsync: str = "no"
                  ) -> Iterator[subprocess.Popen[bytes]]:
    """
    Debian's redis-server on loopback C{port}, its append-only file in C{datadir}.

    Every write is logged to the AOF (C{--appendonly yes}); C{fsync} is
    C{--appendfsync}: C{"always"} (fsync before the reply, what a durable
    queue needs) or C{"no"} (the kernel flushes when it likes). No RDB
    snapshots (C{--save ''}), so the AOF is the only disk work.
    """
    datadir.mkdir(parents=True, exist_ok=True)
    proc = _popen([binary, "--port", str(port), "--bind", "127.0.0.1",
                             "--dir", str(datadir), "--appendonly", "yes",
                             "--appendfsync", fsync, "--save", "", "--daemonize", "no",
                             "--logfile", str(datadir / "redis.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with serving(proc, port):
        yield proc


@contextmanager
def beanstalkd_process(binary: str, port: int, datadir: Path, fsync_always: bool = False
                       ) -> Iterator[subprocess.Popen[bytes]]:
    """
    Debian's beanstalkd on loopback C{port}, its write-ahead log in C{datadir}.

    With C{fsync_always} it runs with C{-f 0} (fsync after every write);
    otherwise with C{-F} (never fsync: the kernel flushes when it likes).
    """
    datadir.mkdir(parents=True, exist_ok=True)
    command = [binary, "-l", "127.0.0.1", "-p", str(port), "-b", str(datadir)]
    command += ["-f", "0"] if fsync_always else ["-F"]
    proc = _popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with serving(proc, port):
        yield proc


def summary(rates: list[float]) -> str:
    """Format rates as "median (min-max)"."""
    return f"{statistics.median(rates):>9,.0f} ({min(rates):,.0f}-{max(rates):,.0f})"


@contextmanager
def floor_process(port: int, reactor: str = "kestrel", journal: Path | None = None,
                  durable: bool = False,
                  bookkeeping: bool = False) -> Iterator[subprocess.Popen[bytes]]:
    """
    C{benchmarks/floor_server.py}: the least a Twisted memcache queue costs
    (no journal, unless C{journal} is a folder for its journal files;
    C{durable}: fsynced once per reactor turn before the turn's replies;
    C{bookkeeping}, with C{durable}: Kestrel's per-add bookkeeping too).

    C{reactor} is C{"kestrel"} (txkestrel's), C{"epoll"} (Twisted's own) or
    C{"none"} (a bare C{select.epoll} loop, no Twisted).
    """
    extra: list[str] = []
    if journal is not None:
        journal.mkdir(parents=True, exist_ok=True)
        extra = ["--journal", str(journal), *(["--durable"] if durable else []),
                 *(["--bookkeeping"] if bookkeeping else [])]
    proc = _popen([SERVER_PYTHON, str(Path(__file__).with_name("floor_server.py")),
                             "--reactor", reactor, *extra, str(port)],
                            cwd=ROOT, env=python_env(ROOT),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with serving(proc, port):
        yield proc
