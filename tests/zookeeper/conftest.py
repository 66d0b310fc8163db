"""
Fixtures for the ZooKeeper tests: a real ZooKeeper server and a running reactor.

ZooKeeper is Debian's package (C{apt-get install zookeeper}), started with
java directly on a free port in a temporary directory; it is ready in well
under a second. Tests are skipped when java or the jars are missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from tests.support import free_port

#: Seconds a test client may take to connect; generous, for slow CI machines.
START_TIMEOUT = 30

JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-nop.jar")


class ZooKeeperServer:
    """One standalone ZooKeeper process with a fixed port; can be stopped and started again."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.generation = 0

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, fresh_data: bool = False) -> None:
        """Start the server (with an empty data directory if C{fresh_data}) and wait until ready."""
        if fresh_data:
            self.generation += 1
        data = self.base / f"data{self.generation}"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.base / "zoo.cfg"
        cfg.write_text(
            "tickTime=500\nminSessionTimeout=1000\nmaxSessionTimeout=20000\n"
            f"dataDir={data}\nclientPort={self.port}\nclientPortAddress=127.0.0.1\n"
            "maxClientCnxns=0\nadmin.enableServer=false\n4lw.commands.whitelist=ruok,srvr\n"
        )
        self.process = subprocess.Popen(
            ["java", "-Xmx128m", "-XX:+UseSerialGC", "-cp", ":".join(JARS),
             "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(cfg)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.base,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("zookeeper exited at start")
            if self._serving():
                return
            time.sleep(0.05)
        raise RuntimeError("zookeeper did not become ready")

    def _serving(self) -> bool:
        """True once the server answers requests; C{ruok} says imok before it does."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"srvr")
                reply = b""
                while chunk := s.recv(4096):
                    reply += chunk
        except OSError:
            return False
        return b"Mode: standalone" in reply

    def client(self, **options: Any) -> KazooClient:
        """
        A connected kazoo client. Its short session timeout bounds each
        connection attempt, so one stalled attempt on a slow machine is retried
        well within the generous start deadline.
        """
        client = KazooClient(hosts=self.hosts, timeout=3, **options)
        client.start(timeout=START_TIMEOUT)
        return client

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s)."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


@pytest.fixture
def zookeeper(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    """A running ZooKeeper server, stopped after the test."""
    if shutil.which("java") is None or not all(os.path.exists(j) for j in JARS):
        pytest.skip("needs java and Debian's zookeeper package")
    server = ZooKeeperServer(tmp_path / "zk")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def observer(zookeeper: ZooKeeperServer) -> Iterator[KazooClient]:
    """A kazoo client of C{zookeeper} for the test to look with; closed afterwards."""
    client = zookeeper.client()
    yield client
    client.stop()
    client.close()


@pytest.fixture(scope="session")
def running_reactor() -> object:
    """The global reactor, running in a daemon thread for the whole session."""
    from twisted.internet import reactor

    if not reactor.running:
        started = threading.Event()
        reactor.callWhenRunning(started.set)
        threading.Thread(target=reactor.run, kwargs={"installSignalHandlers": False},
                         daemon=True, name="reactor").start()
        assert started.wait(10)
    return reactor
