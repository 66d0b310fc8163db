"""Tests of kestrel.tap (options, config errors) and of the twistd plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from twisted.application.service import IServiceMaker
from twisted.plugin import getPlugins
from twisted.python.usage import UsageError

from kestrel.config import DEFAULT_CONFIG
from kestrel.service import KestrelService
from kestrel.tap import Options, makeService

ROOT = Path(__file__).resolve().parents[2]


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
    with pytest.raises(UsageError, match="status_file: must not be inside queue_path"):
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
    """A config file with an unknown key is a UsageError naming the key."""
    path = tmp_path / "k.yaml"
    path.write_text("memcache_port: 1\nfrobnicate: 2\n")
    with pytest.raises(UsageError, match="frobnicate"):
        parse("--config", str(path))


def test_missing_config_file(tmp_path: Path) -> None:
    """A config file that cannot be read is a UsageError naming the file."""
    with pytest.raises(UsageError, match="nope.yaml"):
        parse("--config", str(tmp_path / "nope.yaml"))


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
    assert isinstance(service, KestrelService)
    assert not service.running


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
