"""
The composition root of C{twistd kestrel}: command-line options and L{makeService}.

C{Options} loads and validates the config (built-in defaults when no
C{--config} is given) and applies the command-line overrides. A malformed
command line is a L{usage.UsageError} (twistd prints the help with it); every
operator error (a config problem, an unusable C{queue_path}, a port in use, a
ZooKeeper problem, a missing optional dependency) is a L{StartError}: one line
C{kestrel: <what>} on stderr and exit status 1, before C{kestrel ready}.
L{makeService} only wires: it is the one place that imports the global reactor.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from twisted.application.service import IService, Service
from twisted.internet.error import CannotListenError
from twisted.logger import Logger
from twisted.python import usage
from twisted.python.reflect import qual

import twisted
from kestrel import __version__
from kestrel.config import DEFAULT_CONFIG, ServerConfig, load_config
from kestrel.errors import ConfigError, KestrelError
from kestrel.limits import raise_open_file_limit
from kestrel.reactor import install_unless_chosen

__all__ = ["Options", "StartError", "StartFailed", "makeService", "version_line"]


class StartError(SystemExit):
    """
    An operator error that stops the server before it is ready.

    It is a C{SystemExit} whose code is the line C{kestrel: <message>}, so the
    interpreter prints exactly that line on stderr and exits with status 1,
    with no traceback and no help text.
    """

    def __init__(self, message: str) -> None:
        super().__init__(f"kestrel: {message}")
        self.message = message


class StartFailed(Exception):
    """The server could not start (a daemon's report to twistd); the message is the one line."""


def _kazoo_installed() -> bool:
    """Whether the ZooKeeper client library (the C{zookeeper} extra) can be imported."""
    try:
        import kazoo  # noqa: F401
    except ImportError:
        return False
    return True


def version_line() -> str:
    """The line C{--version} prints: txkestrel's version, then Twisted's and Python's."""
    python = ".".join(map(str, sys.version_info[:3]))
    return f"txkestrel {__version__} (Twisted {twisted.__version__}, Python {python})"


def _port(value: str) -> int:
    """Parse a TCP port number (0 disables the listener)."""
    port = int(value)
    if not 0 <= port <= 65535:
        raise ValueError(f"port {value} is not in 0..65535")
    return port


_port.coerceDoc = "0 disables the listener."  # type: ignore[attr-defined]


def _default(field: str) -> str:
    """The built-in default of a server-level config field, for --help."""
    value = getattr(DEFAULT_CONFIG, field, None)
    return "disabled" if value in (None, 0) else str(value)


class Options(usage.Options):
    """
    Options of C{twistd kestrel}; each overrides the config file.

    After parsing, C{self.config} holds the resolved L{ServerConfig}.
    """

    synopsis = "[options]"
    longdesc = ("A durable message queue server speaking Kestrel's memcache, text and "
                "thrift protocols. With no options it runs on the built-in defaults.")

    optParameters = [  # noqa: N815 - Twisted's name
        ["config", "c", None, "YAML config file (default: none, the built-in defaults)."],
        ["queue-path", None, None,
         f"Journal directory (default: {_default('queue_path')}). Unless the config file "
         "sets status_file, the status file goes to ./kestrel-status, or beside the "
         "journal directory (<dir>.kestrel-status) when that would be inside it."],
        ["listen-address", None, None,
         f"Bind address of every listener (default: {_default('listen_address')})."],
        ["memcache-port", None, None,
         f"Memcache port (default: {_default('memcache_port')})", _port],
        ["text-port", None, None, f"Text protocol port (default: {_default('text_port')})",
         _port],
        ["thrift-port", None, None, f"Thrift port (default: {_default('thrift_port')})", _port],
        ["admin-port", None, None, f"Admin HTTP port (default: {_default('admin_port')})",
         _port],
    ]

    config: ServerConfig

    def opt_version(self) -> None:
        """Print the txkestrel version (and Twisted's and Python's) and exit."""
        print(version_line())
        raise SystemExit(0)

    def postOptions(self) -> None:
        """
        Load the config file (or the defaults) and apply the command-line overrides.

        Raises L{StartError} for a config problem (the file's own messages
        name the file, line and key) or a C{zookeeper:} section without kazoo.
        """
        path = self["config"]
        try:
            config = load_config(path) if path else DEFAULT_CONFIG
        except ConfigError as e:
            raise StartError("; ".join(e.problems)) from e
        except OSError as e:
            raise StartError(f"cannot read config file {path}: {e.strerror}") from e
        overrides: dict[str, object] = {}
        for option, field in [("queue-path", "queue_path"),
                              ("listen-address", "listen_address"),
                              ("memcache-port", "memcache_port"), ("text-port", "text_port"),
                              ("thrift-port", "thrift_port"), ("admin-port", "admin_port")]:
            if self[option] is not None:
                overrides[field] = self[option]
        try:
            self.config = config.with_overrides(**overrides) if overrides else config
        except ConfigError as e:
            problems = [p.removeprefix("<overrides>: ") for p in e.problems]
            raise StartError("bad option: " + "; ".join(problems)) from e
        # Here, before twistd or twist install their default reactor, which
        # happens after the subcommand's options are parsed; a reactor the
        # user chose with --reactor is already installed and kept.
        install_unless_chosen()
        if self.config.zookeeper is not None and not _kazoo_installed():
            raise StartError(
                f"zookeeper: {path or 'the config'} has a zookeeper section but kazoo is not "
                "installed; pip install 'txkestrel[zookeeper]' or remove the section")

    def source_of(self, option: str) -> str:
        """Where a setting came from: its command-line option, the config file, or the default."""
        if self[option] is not None:
            return f"--{option}"
        return self["config"] or "the built-in default"


class StartErrors(Service):
    """
    The server's service as twistd runs it: logs where the config and the
    queues are, and turns an operator error while starting (a port in use, a
    ZooKeeper problem) into one line C{kestrel: <what>} on the process's stderr
    and exit status 1.

    A server that stops itself after it began listening, because a journal
    cannot be replayed (the inner service's C{start_error}), ends the same
    way once it has shut down: that line on stderr and exit status 1.

    Stopping is the inner service's (it returns the inner Deferred).
    """

    _log = Logger()

    def __init__(self, inner: IService, options: Options, reactor: Any = None) -> None:
        self.inner = inner
        self.options = options
        self.reactor = reactor

    def privilegedStartService(self) -> None:
        """Nothing privileged here: the listeners open in L{startService}."""
        self.inner.privilegedStartService()

    def startService(self) -> None:
        """Log the config file and queue path, start the server, or raise L{StartError}."""
        config = self.options.config
        self._log.info("txkestrel {version} starting: config {config}, queue_path {queue_path}, "
                       "reactor {reactor}",
                       version=__version__, reactor=qual(type(self.reactor)),
                       config=os.path.abspath(self.options["config"]) if self.options["config"]
                       else "built-in defaults",
                       queue_path=os.path.abspath(config.queue_path))
        soft, hard = raise_open_file_limit()
        self._log.info("Open file limit {soft} (hard {hard})", soft=soft, hard=hard)
        if self.reactor is not None:
            self.reactor.addSystemEventTrigger("after", "shutdown", self._exit_if_start_failed)
        try:
            self.inner.startService()
        except CannotListenError as e:
            self._fail(str(e))
        except KestrelError as e:
            if type(e).__module__ == "kestrel.serverset":
                hint = (" (memcache_port, text_port and thrift_port are all disabled)"
                        if "no endpoint" in str(e)
                        else f" (listen_address is {config.listen_address})")
                self._fail(f"zookeeper: {e}{hint}")
            self._fail(str(e))
        super().startService()

    def _exit_if_start_failed(self) -> None:
        """After shutdown: a server that stopped itself for a start error exits with status 1."""
        message = getattr(self.inner, "start_error", None)
        if message is None:
            return
        self._tell_operator(message)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        # twistd ends with status 0 once its reactor has stopped, whatever
        # stopped it; the journals are closed by now, so leave at once.
        os._exit(1)

    def _fail(self, message: str) -> None:
        # The service has logged the error already.
        parent = getattr(self.options, "parent", None)
        if parent is not None and not parent.get("nodaemon", True):
            # Daemon: stderr is gone; twistd reports this exception's message
            # through its status pipe ("An error has occurred: ...") and exits 1.
            raise StartFailed(message)
        self._tell_operator(message)
        raise SystemExit(1)

    def _tell_operator(self, message: str) -> None:
        """Remove the pid file and write C{kestrel: <message>} to the process's real stderr."""
        # (twistd has replaced sys.stderr by the log, so the one line goes to the real one.)
        self._remove_pidfile()
        stderr = sys.__stderr__ or sys.stderr
        stderr.write(f"kestrel: {message}\n")
        stderr.flush()

    def _remove_pidfile(self) -> None:
        """Remove twistd's pid file (it is written before the start, and left on SystemExit)."""
        parent = getattr(self.options, "parent", None)
        pidfile = parent.get("pidfile") if parent is not None else None
        try:
            if pidfile and int(Path(pidfile).read_text().strip() or 0) == os.getpid():
                os.remove(pidfile)
        except (OSError, ValueError):
            pass

    def stopService(self) -> object:
        """Stop the server (the Deferred of its ordered stop)."""
        super().stopService()
        return self.inner.stopService()


def makeService(options: Options) -> IService:
    """
    Build the server's service on the global reactor from parsed C{options}.

    Raises L{StartError} if C{queue_path} cannot be created or written.
    """
    from twisted.internet import reactor

    from kestrel.service import make_kestrel_service

    try:
        service = make_kestrel_service(options.config, reactor, config_path=options["config"])
    except ConfigError as e:
        where = f" (set by {options.source_of('queue-path')})" if "queue_path" in str(e) else ""
        raise StartError(f"{e}{where}") from e
    return StartErrors(service, options, reactor)
