"""
The composition root of C{twistd kestrel}: command-line options and L{makeService}.

C{Options} loads and validates the config (built-in defaults when no
C{--config} is given) and applies the command-line overrides, so that every
problem surfaces as a L{usage.UsageError} before anything starts.
L{makeService} only wires: it is the one place that imports the global reactor.
"""

from __future__ import annotations

from twisted.application.service import IService
from twisted.python import usage

from kestrel.config import DEFAULT_CONFIG, ServerConfig, load_config
from kestrel.errors import ConfigError

__all__ = ["Options", "makeService"]


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

    def postOptions(self) -> None:
        """Load the config file (or the defaults) and apply the command-line overrides."""
        path = self["config"]
        try:
            config = load_config(path) if path else DEFAULT_CONFIG
        except ConfigError as e:
            raise usage.UsageError(f"config file {path}: " + "; ".join(e.problems)) from e
        except OSError as e:
            raise usage.UsageError(f"cannot read config file {path}: {e.strerror}") from e
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
            raise usage.UsageError("bad option: " + "; ".join(problems)) from e


def makeService(options: Options) -> IService:
    """Build the server's service on the global reactor from parsed C{options}."""
    from twisted.internet import reactor

    from kestrel.service import make_kestrel_service

    return make_kestrel_service(options.config, reactor, config_path=options["config"])
