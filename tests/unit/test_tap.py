"""Tests of kestrel.tap (options, config errors) and of the twistd plugin."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from twisted.application.service import IServiceMaker
from twisted.plugin import getPlugins
from twisted.python.usage import UsageError

import kestrel
from kestrel.config import DEFAULT_CONFIG
from kestrel.service import KestrelService
from kestrel.tap import Options, StartError, StartErrors, makeService
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]

#: For a start that gets past the "kazoo is not installed" check to a later one.
needs_kazoo = pytest.mark.skipif(importlib.util.find_spec("kazoo") is None,
                                 reason="needs kazoo (the zookeeper extra)")


def parse(*args: str) -> Options:
    options = Options()
    options.parseOptions(list(args))
    return options


def test_no_options_gives_builtin_defaults() -> None:
    """With no options the config is the built-in default."""
    assert parse().config == DEFAULT_CONFIG


def test_options_override_config(tmp_path: Path) -> None:
    """Command-line options override the config file; port 0 disables a listener."""
    path = tmp_path / "k.yaml"
    path.write_text("memcache_port: 1234\ntext_port: 2345\ndefault: {max_items: 5}\n")
    config = parse("-c", str(path), "--memcache-port", "4321", "--thrift-port", "0",
                   "--queue-path", str(tmp_path / "q"), "--listen-address", "0.0.0.0").config
    assert (config.memcache_port, config.text_port, config.thrift_port) == (4321, 2345, None)
    assert config.queue_path == str(tmp_path / "q")
    assert config.listen_address == "0.0.0.0"
    assert config.default.max_items == 5


@pytest.mark.parametrize("option, field", [
    ("--memcache-port", "memcache_port"), ("--text-port", "text_port"),
    ("--thrift-port", "thrift_port"), ("--admin-port", "admin_port"),
])
def test_port_zero_disables_listener(option: str, field: str, tmp_path: Path) -> None:
    """A port option of 0 disables that listener (None), as 0 does in the config file."""
    path = tmp_path / "k.yaml"
    path.write_text(f"{field}: 1234\n")
    config = parse("-c", str(path), option, "0").config
    assert getattr(config, field) is None


def test_queue_path_rechecks_status_file(tmp_path: Path) -> None:
    """--queue-path is checked against the config file's status_file: inside it is refused."""
    path = tmp_path / "k.yaml"
    path.write_text(f"status_file: {tmp_path / 'q' / 'status'}\n")
    with pytest.raises(StartError, match="status_file: must not be inside queue_path"):
        parse("-c", str(path), "--queue-path", str(tmp_path / "q"))


def test_queue_path_dot_moves_default_status_file(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """
    With the built-in status file, --queue-path . puts the status file beside
    the queue folder (<abs queue path>.kestrel-status), never inside it.
    """
    monkeypatch.chdir(tmp_path)
    config = parse("--queue-path", ".").config
    assert config.queue_path == "."
    assert config.status_file == str(tmp_path) + ".kestrel-status"
    assert not Path(config.status_file).resolve().is_relative_to(tmp_path.resolve())


def test_queue_path_elsewhere_keeps_default_status_file(tmp_path: Path) -> None:
    """A --queue-path that does not contain ./kestrel-status keeps the default status file."""
    config = parse("--queue-path", str(tmp_path / "q")).config
    assert config.status_file == "./kestrel-status"


def test_configured_status_file_is_kept(tmp_path: Path) -> None:
    """A status_file set in the config file outside the new queue path is left alone."""
    path = tmp_path / "k.yaml"
    path.write_text(f"status_file: {tmp_path / 'status'}\n")
    config = parse("-c", str(path), "--queue-path", str(tmp_path / "q")).config
    assert config.status_file == str(tmp_path / "status")


@pytest.mark.parametrize("args", [["--memcache-port", "x"], ["--admin-port", "70000"]])
def test_bad_port_is_usage_error(args: list[str]) -> None:
    """A port that is not a number in 0..65535 is a UsageError."""
    with pytest.raises(UsageError):
        parse(*args)


def test_config_error_names_problem(tmp_path: Path) -> None:
    """A config file with an unknown key is a StartError naming the file, line and key."""
    path = tmp_path / "k.yaml"
    path.write_text("memcache_port: 1\nfrobnicate: 2\n")
    with pytest.raises(StartError) as error:
        parse("--config", str(path))
    assert error.value.code == f"kestrel: {path}:2: frobnicate: unknown setting"


def test_missing_config_file(tmp_path: Path) -> None:
    """A config file that cannot be read is a StartError naming the file."""
    with pytest.raises(StartError, match="nope.yaml"):
        parse("--config", str(tmp_path / "nope.yaml"))


def test_unusable_queue_path_names_its_source(tmp_path: Path) -> None:
    """A queue_path under a plain file is a StartError naming queue_path and where it was set."""
    (tmp_path / "file").write_text("")
    options = parse("--queue-path", str(tmp_path / "file" / "q"))
    with pytest.raises(StartError, match=r"^kestrel: queue_path: .*\(set by --queue-path\)$"):
        makeService(options)


def test_help_shows_defaults() -> None:
    """--help lists every option with its default."""
    text = str(Options())
    for word in ("--config", "--queue-path", "--listen-address", "--memcache-port",
                 "--text-port", "--thrift-port", "--admin-port", "22133", "2222", "2229",
                 "2223", "127.0.0.1"):
        assert word in text


def test_make_service(tmp_path: Path) -> None:
    """makeService builds the server's service without starting it."""
    options = parse("--queue-path", str(tmp_path / "q"))
    service = makeService(options)
    assert isinstance(service, StartErrors)
    assert isinstance(service.inner, KestrelService)
    assert not service.running and not service.inner.running


def test_plugin_is_found() -> None:
    """The twistd plugin `kestrel` is discoverable from the checkout."""
    import twisted.plugins

    makers = {m.tapname: m for m in getPlugins(IServiceMaker, twisted.plugins)}
    assert makers["kestrel"].options is Options


def _twistd() -> list[str]:
    """The twistd command of this Python installation."""
    return [sys.executable, "-c", "import sys; from twisted.scripts.twistd import run; run()"]


@pytest.mark.parametrize("command", [
    [sys.executable, "-m", "twisted", "kestrel", "--help"],
    [*_twistd(), "-n", "kestrel", "--help"],
])
def test_help_from_repo_root(command: list[str]) -> None:
    """
    `python -m twisted kestrel --help` and `twistd -n kestrel --help` work from
    the root of a checkout (twistd with the checkout on PYTHONPATH, as the guide says).
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env=env)
    assert result.returncode == 0, result.stderr
    assert "--memcache-port" in result.stdout


# -- the operator's view: twistd itself, stderr and the exit status ---------------------


def _run_twistd(tmp_path: Path, *args: str, timeout: float = 60,
                prelude: str = "") -> subprocess.CompletedProcess[str]:
    """Run `twistd -n --pidfile= kestrel ARGS` in tmp_path; prelude runs first (Python)."""
    code = f"import sys\n{prelude}\nfrom twisted.scripts.twistd import run; run()"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, "-n", "--pidfile=", "kestrel", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                          env=env)


NO_PORTS = ["--memcache-port", "0", "--text-port", "0", "--thrift-port", "0",
            "--admin-port", "0"]


def _log_until_ready(server: subprocess.Popen[str]) -> list[str]:
    """The server's output lines up to its C{kestrel ready} line (or its end)."""
    assert server.stdout is not None
    log = []
    for line in server.stdout:
        log.append(line)
        if "kestrel ready" in line:
            break
    return log


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a refused start (exit 1, no help, never ready)."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "--memcache-port" not in result.stdout + result.stderr  # no help text
    assert "kestrel ready" not in result.stdout
    assert lines[0].startswith("kestrel: ")
    return lines[0]


def test_typo_in_config_is_one_line(tmp_path: Path) -> None:
    """A typo'd key: one line naming file, line and key; no help text; status 1."""
    (tmp_path / "k.yaml").write_text("queue_path: q\nmemcache_prot: 1234\n")
    line = _one_line(_run_twistd(tmp_path, "-c", "k.yaml"))
    assert line == "kestrel: k.yaml:2: memcache_prot: unknown setting"


def test_bad_value_is_one_line(tmp_path: Path) -> None:
    """A bad value: one line naming file, line, key and the value."""
    (tmp_path / "k.yaml").write_text("\nadmin_port: lots\n")
    line = _one_line(_run_twistd(tmp_path, "-c", "k.yaml"))
    assert line.startswith("kestrel: k.yaml:2: admin_port: ") and "'lots'" in line


def test_port_in_use_is_one_line_naming_the_listener(tmp_path: Path) -> None:
    """A port in use: one line naming the listener, address and port; status 1."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = _run_twistd(tmp_path, "--queue-path", "q", *NO_PORTS,
                             "--thrift-port", str(port))
    line = _one_line(result)
    assert line == (f"kestrel: thrift_port: cannot listen on 127.0.0.1:{port} "
                    "for the thrift listener: Address already in use")


def test_queue_path_under_a_file_is_one_line(tmp_path: Path) -> None:
    """A queue_path that cannot be a directory: one line naming queue_path and its source."""
    (tmp_path / "file").write_text("")
    (tmp_path / "k.yaml").write_text("queue_path: file/q\n")
    line = _one_line(_run_twistd(tmp_path, "-c", "k.yaml", *NO_PORTS))
    assert line.startswith("kestrel: queue_path: ") and "'file/q'" in line
    assert line.endswith("(set by k.yaml)")


def test_port_in_use_as_a_daemon(tmp_path: Path) -> None:
    """Without -n, twistd reports the refused start and exits 1; the pid file is removed."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = "import sys\nfrom twisted.scripts.twistd import run; run()"
        result = subprocess.run(
            [sys.executable, "-c", code, "--pidfile=k.pid", "--logfile=k.log", "kestrel",
             "--queue-path", "q", *NO_PORTS, "--memcache-port", str(port)],
            cwd=tmp_path, capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 1
    assert "An error has occurred: b'kestrel.tap.StartFailed: memcache_port: " in result.stderr
    assert not (tmp_path / "k.pid").exists()
    assert f"127.0.0.1:{port} for the memcache listener" in (tmp_path / "k.log").read_text()


@needs_kazoo
def test_zookeeper_with_loopback_address_is_one_line(tmp_path: Path) -> None:
    """A zookeeper section while listening on loopback cannot be advertised: one line."""
    (tmp_path / "k.yaml").write_text("zookeeper: {host: 127.0.0.1, path_prefix: /kestrel}\n")
    line = _one_line(_run_twistd(tmp_path, "-c", "k.yaml", "--queue-path", "q", *NO_PORTS,
                                 "--memcache-port", str(free_port())))
    assert line.startswith("kestrel: zookeeper: ") and "loopback" in line
    assert line.endswith("(listen_address is 127.0.0.1)")


@needs_kazoo
def test_zookeeper_with_nothing_to_advertise_is_one_line(tmp_path: Path) -> None:
    """A zookeeper section with every client listener disabled: one line saying so."""
    (tmp_path / "k.yaml").write_text("zookeeper: {host: 127.0.0.1, path_prefix: /kestrel}\n")
    line = _one_line(_run_twistd(tmp_path, "-c", "k.yaml", "--queue-path", "q", *NO_PORTS,
                                 "--listen-address", "0.0.0.0"))
    assert line == ("kestrel: zookeeper: no endpoint to advertise "
                    "(memcache_port, text_port and thrift_port are all disabled)")


def test_zookeeper_without_kazoo_is_one_line(tmp_path: Path) -> None:
    """A zookeeper section without kazoo installed is refused before start, naming the fix."""
    (tmp_path / "k.yaml").write_text("zookeeper: {host: zk.example, path_prefix: /kestrel}\n")
    result = _run_twistd(tmp_path, "-c", "k.yaml", prelude="sys.modules['kazoo'] = None")
    line = _one_line(result)
    assert "k.yaml has a zookeeper section but kazoo is not installed" in line
    assert "txkestrel[zookeeper]" in line


def test_journal_that_cannot_be_replayed_is_one_line_and_status_1(tmp_path: Path) -> None:
    """
    The server listens before it replays; a journal whose replay fails (here
    an I/O error injected into the replay) stops it after it began listening,
    and the process still ends as a refused start: one line, status 1.
    """
    queues = tmp_path / "q"
    queues.mkdir()
    (queues / "old").write_bytes(b"")
    prelude = ("from kestrel.queue import PersistentQueue\n"
               "def broken(self, *args, **kwargs):\n"
               "    raise OSError(5, 'Input/output error')\n"
               "PersistentQueue.setup_steps = broken\n")
    result = _run_twistd(tmp_path, "--queue-path", "q", *NO_PORTS, "--memcache-port", "0",
                         prelude=prelude)
    line = _one_line(result)
    assert line.startswith("kestrel: a journal cannot be replayed: ")
    assert "Input/output error" in line


def test_usage_error_still_shows_help(tmp_path: Path) -> None:
    """A malformed command line is a usage error: twistd prints the help, status 1."""
    result = _run_twistd(tmp_path, "--no-such-option")
    assert result.returncode == 1
    assert "--memcache-port" in result.stdout


def test_version_prints_txkestrel_version(tmp_path: Path) -> None:
    """`twistd kestrel --version` prints txkestrel's version (the one in pyproject.toml)."""
    result = _run_twistd(tmp_path, "--version")
    assert result.returncode == 0, result.stderr
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert kestrel.__version__ == project["version"]
    assert result.stdout.startswith(f"txkestrel {kestrel.__version__} (Twisted ")


def test_start_log_and_ctrl_c(tmp_path: Path) -> None:
    """
    The start-up log names the absolute config file and queue path; SIGINT
    (Ctrl-C) stops the server cleanly with status 0.
    """
    (tmp_path / "k.yaml").write_text("queue_path: data\n")
    port = free_port()
    code = "import sys; from twisted.scripts.twistd import run; run()"
    server = subprocess.Popen(
        [sys.executable, "-c", code, "-n", "--pidfile=", "kestrel", "-c", "k.yaml", *NO_PORTS,
         "--memcache-port", str(port)], cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        log = _log_until_ready(server)
        # A reply means the reactor runs, so the server's signal handlers are in place.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(b"version\r\n")
            assert client.recv(100).startswith(b"VERSION ")
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    start = next(line for line in log if "starting: config" in line)
    assert f"config {tmp_path / 'k.yaml'}, queue_path {tmp_path / 'data'}" in start
    assert start.rstrip().endswith("reactor kestrel.reactor.KestrelReactor")
    assert server.returncode == 0, err
    assert "Received SIGINT, shutting down" in out and "kestrel stopped" in out


@pytest.mark.parametrize("launcher, reactor_option, reactor", [
    ("twistd", [], "kestrel.reactor.KestrelReactor"),
    ("twist", [], "kestrel.reactor.KestrelReactor"),
    ("twistd", ["--reactor", "kestrel"], "kestrel.reactor.KestrelReactor"),
    ("twistd", ["--reactor", "epoll"], "twisted.internet.epollreactor.EPollReactor"),
    ("twist", ["--reactor", "poll"], "twisted.internet.pollreactor.PollReactor"),
])
def test_server_runs_on_its_reactor_unless_one_is_chosen(
        tmp_path: Path, launcher: str, reactor_option: list[str], reactor: str) -> None:
    """
    `twistd kestrel` and `python -m twisted kestrel` run on KestrelReactor;
    a reactor chosen with --reactor is kept. The start-up log names it, and
    the server answers on it.
    """
    port = free_port()
    args = ["kestrel", "--queue-path", str(tmp_path / "q"), *NO_PORTS[2:],
            "--memcache-port", str(port), "--thrift-port", "0"]
    if launcher == "twistd":
        command = [sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
                   "-n", "--pidfile=", *reactor_option, *args]
    else:
        command = [sys.executable, "-m", "twisted", "--log-format=text", *reactor_option, *args]
    server = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        log = _log_until_ready(server)
        start = next(line for line in log if "starting: config" in line)
        assert start.rstrip().endswith(f"reactor {reactor}"), log
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(b"set q 0 0 2\r\nhi\r\nget q\r\n")
            reply = b""
            while not reply.endswith(b"END\r\n"):
                reply += client.recv(100)
            assert reply == b"STORED\r\nVALUE q 0 2\r\nhi\r\nEND\r\n"
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()
