"""
Wire-test infrastructure: a REAL server process, started as `python -m twisted kestrel`
(or, with `launcher="twistd"`, as the README's `twistd -n kestrel`).

`KestrelProcess` owns one server in its own directory (journals, status
file, config file, log). It picks free loopback ports for every listener
asked for, writes the config (plus any extra settings), starts the process,
waits for the `kestrel ready` log line, and can stop it (SIGTERM, clean),
kill it (SIGKILL), restart it on the same ports and journals, and rewrite its
config for a `reload`.

Fixtures:
  - `kestrel_factory`: a function building (and, at teardown, stopping)
    servers: `kestrel_factory(protocols=("memcache",), config={...})`;
    `launcher="twistd"` starts it with the `twistd` script instead.
  - `kestrel`: one server per test module with memcache, text and thrift
    listeners (the admin listener too when `kestrel.admin` exists).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]
PROTOCOLS = ("memcache", "text", "thrift", "admin")
READY = "kestrel ready"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0
#: How a server is started: Twisted's `twist` runner, or the `twistd` script.
LAUNCHERS = ("module", "twistd")


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge C{extra} into a copy of C{base} (mappings merge, other values replace)."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def twistd_path() -> str:
    """The C{twistd} script of the running Python (beside it, else the one on C{PATH})."""
    beside = Path(sys.executable).parent / "twistd"
    if beside.exists():
        return str(beside)
    found = shutil.which("twistd")
    if found is None:
        raise RuntimeError("no twistd script beside the running Python nor on PATH")
    return found


class KestrelProcess:
    """
    One real server process in C{root}, driven from a test.

    C{launcher} is C{"module"} (C{python -m twisted --log-format=text kestrel},
    run from the checkout) or C{"twistd"} (C{twistd -n kestrel}, the README's
    form, run from C{root} so that twistd's C{twistd.pid} lands there).
    """

    def __init__(self, root: Path, protocols: tuple[str, ...] = ("memcache",),
                 config: Mapping[str, Any] | None = None, host: str = "127.0.0.1",
                 launcher: str = "module", log_level: str | None = None) -> None:
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {LAUNCHERS}, not {launcher!r}")
        self.root = root
        self.host = host
        self.launcher = launcher
        #: C{--log-level} of the C{module} launcher (default: twist's, info).
        self.log_level = log_level
        root.mkdir(parents=True, exist_ok=True)
        self.queue_path = root / "queues"
        self.status_file = root / "status"
        self.config_path = root / "kestrel.yaml"
        self.log_path = root / "kestrel.log"
        self.ports = ports_for(protocols)
        self.extra_config: dict[str, Any] = dict(config or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self.write_config()

    # -- config ----------------------------------------------------------

    def config_dict(self) -> dict[str, Any]:
        """The config the server gets: our paths and ports, then the extra settings."""
        base = {
            "listen_address": self.host,
            "queue_path": str(self.queue_path),
            "status_file": str(self.status_file),
            **{f"{name}_port": port for name, port in self.ports.items()},
        }
        return _merge(base, self.extra_config)

    def write_config(self, extra: Mapping[str, Any] | None = None) -> None:
        """(Re)write the config file, replacing the extra settings when C{extra} is given."""
        if extra is not None:
            self.extra_config = dict(extra)
        self.config_path.write_text(yaml.safe_dump(self.config_dict(), sort_keys=False))

    @property
    def memcache_port(self) -> int:
        """The memcache port (0 when disabled)."""
        return self.ports["memcache"]

    # -- process ---------------------------------------------------------

    def command(self) -> list[str]:
        """The command line that starts this server, per its launcher."""
        if self.launcher == "twistd":
            return [twistd_path(), "-n", "kestrel", "--config", str(self.config_path)]
        level = [f"--log-level={self.log_level}"] if self.log_level else []
        return [sys.executable, "-m", "twisted", "--log-format=text", *level, "kestrel",
                "--config", str(self.config_path)]

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the server and wait for its C{kestrel ready} line."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                self.command(), cwd=self.root if self.launcher == "twistd" else ROOT, env=env,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if READY in self.new_log():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"kestrel exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"kestrel not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        """Everything the server processes of this directory logged."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def new_log(self) -> str:
        """What the current process logged."""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_offset)
            return f.read().decode(errors="replace")

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """Stop with SIGTERM, wait, and return the exit status."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def wait_exit(self, timeout: float = STOP_TIMEOUT) -> int:
        """Wait for the process to end by itself (e.g. after C{shutdown})."""
        assert self.proc is not None
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """Kill the process with SIGKILL (no clean close) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def signal(self, signum: int) -> None:
        """Send C{signum} to the process."""
        assert self.proc is not None
        self.proc.send_signal(signum)

    def restart(self) -> int:
        """Stop cleanly and start again on the same ports and journals; return the exit status."""
        status = self.stop()
        self.start()
        return status

    # -- clients ---------------------------------------------------------

    def connect(self, protocol: str = "memcache", timeout: float = 10.0) -> socket.socket:
        """A blocking socket connected to one of the listeners."""
        return socket.create_connection((self.host, self.ports[protocol]), timeout=timeout)

    def address(self, protocol: str = "memcache") -> str:
        """C{host:port} of a listener, as memcache clients want it."""
        return f"{self.host}:{self.ports[protocol]}"


def ports_for(protocols: tuple[str, ...]) -> dict[str, int]:
    """A new free port (L{free_port}) for each of C{protocols}; 0 (off) for the others."""
    return {name: (free_port() if name in protocols else 0) for name in PROTOCOLS}


def start_on_free_ports(server: KestrelProcess, tries: int = 3) -> None:
    """
    Start a new C{server}; when another process took one of its ports between
    L{free_port} and the server's C{listen}, choose new ports and start it again
    (up to C{tries} starts). Its ports are not handed to a test before it runs.
    """
    for attempt in range(1, tries + 1):
        try:
            server.start()
            return
        except RuntimeError:
            if attempt == tries or "Address already in use" not in server.new_log():
                raise
        server.ports = ports_for(tuple(name for name, port in server.ports.items() if port))
        server.write_config()


@pytest.fixture(scope="module")
def kestrel_factory(tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[Callable[..., KestrelProcess]]:
    """
    Build and start servers (`protocols`, `config`, `start`, `launcher`,
    `log_level`); all stop at the end.
    """
    made: list[KestrelProcess] = []

    def make(protocols: tuple[str, ...] = ("memcache",), config: Mapping[str, Any] | None = None,
             start: bool = True, launcher: str = "module",
             log_level: str | None = None) -> KestrelProcess:
        server = KestrelProcess(tmp_path_factory.mktemp("kestrel"), protocols, config,
                                launcher=launcher, log_level=log_level)
        made.append(server)
        if start:
            start_on_free_ports(server)
        return server

    yield make
    for server in made:
        with contextlib.suppress(Exception):
            server.stop()


@pytest.fixture(scope="module")
def kestrel(kestrel_factory: Callable[..., KestrelProcess]) -> KestrelProcess:
    """One running server per module with memcache, text, thrift (and admin) listeners."""
    return kestrel_factory(protocols=PROTOCOLS)


class LineClient:
    """A raw-socket client that reads replies by lines and exact byte counts."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def send(self, data: bytes) -> None:
        """Send raw bytes."""
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        if not chunk:
            return False
        self.buf += chunk
        return True

    def line(self) -> bytes:
        """The next reply line, with its C{\\r\\n}; b"" at EOF."""
        while b"\n" not in self.buf:
            if not self._fill():
                rest, self.buf = self.buf, b""
                return rest
        i = self.buf.index(b"\n") + 1
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def exactly(self, n: int) -> bytes:
        """The next C{n} bytes (fewer at EOF)."""
        while len(self.buf) < n and self._fill():
            pass
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def until(self, terminator: bytes) -> bytes:
        """Everything up to and including C{terminator} (what arrived, at EOF)."""
        while terminator not in self.buf:
            if not self._fill():
                rest, self.buf = self.buf, b""
                return rest
        i = self.buf.index(terminator) + len(terminator)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def closed(self) -> bool:
        """Whether the server closed the connection (after any buffered bytes)."""
        if self.buf:
            return False
        try:
            return not self._fill()
        except ConnectionResetError:
            return True

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


def text_lines(server: KestrelProcess, *lines: bytes) -> list[bytes]:
    """Send C{lines} on one new text connection; the reply line to each, in order."""
    client = LineClient(server.connect("text"))
    try:
        replies = []
        for line in lines:
            client.send(line)
            replies.append(client.line())
        return replies
    finally:
        client.close()
