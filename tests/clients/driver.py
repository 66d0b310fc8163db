"""
Clients in other languages, driven from pytest: each is a small program
(``tests/clients/<lang>/``) that holds one client object for its whole run
and performs the matrix's operations that pytest asks of it, one request
line at a time, so that an open read and its close go through the same
client (and so the same connection), as they would in an application.

The driver protocol, over the program's stdin and stdout, one line each way
(every name and value hex-encoded, so that any bytes pass through):

    set <queue> <data>     -> ok                 the client's set (or put)
    get <key>              -> value <data> | none  the client's get of <key>
    stat <name>            -> value <text> | none  one statistic from the client's stats call
    delete <queue>         -> ok                 the client's delete
    flush <queue>          -> ok                 C{flush <queue>}, where the client can send it
    flush_all              -> ok                 the client's flush of every queue
    version                -> value <text>       the client's version call
    quit                   -> ok                 (the program then exits)

A program answers ``error <message>`` (plain text) when the client raised
or reported a failure (a set that returns false, an unexpected reply, ...);
pytest fails the test with that message. A program is given the server as
its two arguments, C{<host> <port>}, and configures its client with
timeouts longer than every blocking read of the matrix.

A program whose language or client is missing from the machine makes its
tests skip (which fails the run under C{KESTREL_REQUIRE_ALL=1}, as CI sets).
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import ClassVar

import pytest

from tests.clients.matrix import MemcacheAdapter
from tests.wire.conftest import KestrelProcess

#: The folder of the programs.
HERE = Path(__file__).resolve().parent
#: How long a program may take to answer one request (s): far longer than any /t= wait.
REPLY_TIMEOUT = 30.0
#: How long a program may take to start and answer its first request (a JVM, a compile).
START_TIMEOUT = 120.0


def require(program: str, package: str) -> str:
    """The path of C{program}, or skip the test: C{package} provides it."""
    found = shutil.which(program)
    if found is None:
        pytest.skip(f"{program} is not installed (Debian package {package})")
    return found


def require_file(path: Path, package: str) -> Path:
    """C{path}, or skip the test: C{package} installs it."""
    if not path.exists():
        pytest.skip(f"{path} is missing (install {package})")
    return path


class DriverError(AssertionError):
    """The program answered C{error ...}, or did not answer."""


class DriverAdapter(MemcacheAdapter):
    """
    A client in another language, run as a program speaking the driver
    protocol. A subclass says how to start it (L{argv}) and sets to None the
    operations its client cannot express (with the reason in C{unsupported}).
    """

    #: What the program needs on the machine, for the skip message: (program, Debian package).
    requires: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init__(self, servers: list[KestrelProcess], workdir: Path) -> None:
        super().__init__(servers)
        self.workdir = workdir
        argv = self.argv(workdir)
        server = servers[0]
        self.stderr = tempfile.TemporaryFile(dir=workdir)
        self.proc = subprocess.Popen([*argv, server.host, str(server.memcache_port)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, cwd=workdir)
        self.pending = b""
        self.first = True

    def argv(self, workdir: Path) -> list[str]:
        """The program's command line (without the server); may build it in C{workdir}, or skip."""
        raise NotImplementedError

    # -- the protocol -----------------------------------------------------------------------

    def errors(self) -> str:
        """What the program wrote on stderr so far."""
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")[-4000:]

    def _readline(self, timeout: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                raise DriverError(f"{self.name}: no answer in {timeout} s; stderr:\n"
                                  + self.errors())
            chunk = os.read(fd, 65536)
            if not chunk:
                raise DriverError(f"{self.name}: the program exited "
                                  f"({self.proc.wait(5)}); stderr:\n" + self.errors())
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line.rstrip(b"\r")

    def request(self, op: str, *args: bytes) -> bytes | None:
        """Send one request; return the value of C{value}, None for C{none}, b"" for C{ok}."""
        assert self.proc.stdin is not None
        line = " ".join([op, *(a.hex() for a in args)]) + "\n"
        self.proc.stdin.write(line.encode())
        self.proc.stdin.flush()
        timeout = START_TIMEOUT if self.first else REPLY_TIMEOUT
        self.first = False
        word, _, rest = self._readline(timeout).decode("utf-8", "replace").partition(" ")
        if word == "ok" and not rest:
            return b""
        if word == "value":
            return bytes.fromhex(rest)
        if word == "none" and not rest:
            return None
        raise DriverError(f"{self.name}: {op} {[a.decode('latin-1') for a in args]}: "
                          f"{word} {rest}".rstrip())

    # -- the matrix's operations --------------------------------------------------------------

    def fetch(self, key: str) -> bytes | None:
        return self.request("get", key.encode())

    def set(self, queue: str, data: bytes) -> None:
        assert self.request("set", queue.encode(), data) == b""

    def stats(self, queue: str) -> int:
        value = self.request("stat", f"queue_{queue}_items".encode())
        assert value is not None, f"the client's stats show no queue_{queue}_items"
        return int(value)

    def delete(self, queue: str) -> None:
        assert self.request("delete", queue.encode()) == b""

    def flush(self, queue: str) -> None:
        assert self.request("flush", queue.encode()) == b""

    def flush_all(self) -> None:
        assert self.request("flush_all") == b""

    def version(self) -> str:
        value = self.request("version")
        assert value is not None
        return value.decode()

    def shutdown(self) -> None:
        """Ask the program to quit; kill it if it does not."""
        try:
            if self.proc.poll() is None:
                self.request("quit")
            self.proc.wait(10)
        except (DriverError, OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            self.stderr.close()
