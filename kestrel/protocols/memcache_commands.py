"""
The memcache text protocol's server commands: C{stats}, C{dump_stats},
C{version}, C{flush_all}, C{flush_all_expired}, C{status}, C{reload},
C{dump_config}, C{shutdown} and C{quit}, each run through the connection's
session and server and answered with its reply bytes.

L{CommandHandler} reaches the connection only through
L{kestrel.protocols.fetching.DialectHost}, as the meta and binary handlers do.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.errors import (
    ConfigError,
    ControlRefused,
    ForbiddenStatus,
    KestrelError,
    UnknownStatus,
)
from kestrel.protocols.binary import CloseAfterReply
from kestrel.protocols.fetching import DialectHost
from kestrel.protocols.memcache_parser import Command, encode_text
from kestrel.protocols.memcache_replies import END

__all__ = ["CommandHandler"]

_OK = b"OK\r\n"
#: Commands refused when control is kept to the admin port (a status change too).
_CONTROL_COMMANDS = frozenset({"shutdown", "reload", "flush_all"})


class CommandHandler:
    """
    Answers the server commands (L{Command}) of one memcache connection.

    A command that changes the server (C{shutdown}, C{reload}, C{flush_all},
    a status change) is refused with C{CLIENT_ERROR} unless the session may
    control the server. C{shutdown} and C{quit} raise L{CloseAfterReply}:
    the connection closes once the replies before them are written.
    """

    _log = Logger()

    def __init__(self, host: DialectHost) -> None:
        self.host = host
        self.version_reply = b"VERSION %s\r\n" % host.server.version.encode()

    def serve(self, req: Command) -> bytes | Deferred[bytes]:
        """Run C{req}: its reply bytes, or a Deferred of them (C{reload})."""
        word = req.word
        session = self.host.session
        server = self.host.server
        assert session is not None
        # What a command reports or does (stats, flush_all, ...) sees the items this
        # pass's plain gets replied to as taken, as a client that got them expects.
        session.held_reads.open_peeked()
        if word in _CONTROL_COMMANDS or (word == "status" and req.args):
            try:
                session.check_control(word)
            except ControlRefused as e:
                return b"CLIENT_ERROR %s\r\n" % encode_text(str(e))
        if word == "stats":
            return encode_text(server.stats_text())
        if word == "dump_stats":
            return encode_text(server.dump_stats_text(req.args))
        if word == "version":
            return self.version_reply
        if word == "flush_all":
            session.flush_all()
            return b"" if req.noreply else _OK
        if word == "flush_all_expired":
            return b"%d\r\n" % session.flush_all_expired()
        if word == "status":
            return self._status(req.args)
        if word == "reload":
            return maybeDeferred(server.reload).addCallbacks(
                lambda _: b"Reloaded config.\r\n", self._reload_failed)
        if word == "dump_config":
            return encode_text(server.dump_config_text(req.args))
        if word == "shutdown":
            self._log.info("Shutdown requested over memcache")
            server.request_shutdown()
            raise CloseAfterReply(b"")
        # quit
        raise CloseAfterReply(b"")

    def _reload_failed(self, failure: Failure) -> bytes:
        """A reload that failed keeps the old config; the reply names the problem."""
        exc = failure.value
        if isinstance(exc, (ConfigError, OSError, KestrelError)):
            return b"ERROR reload failed: %s\r\n" % encode_text(str(exc).replace("\n", " "))
        self._log.failure("Reload failed", failure)
        return b"ERROR reload failed: internal error\r\n"

    def _status(self, args: tuple[str, ...]) -> bytes:
        session = self.host.session
        assert session is not None
        if not args:
            return encode_text(str(session.current_status()).upper()) + b"\r\n"
        try:
            session.set_status(args[0])
        except (UnknownStatus, ForbiddenStatus):
            raise
        except KestrelError as exc:
            # A stricter change still in its grace period: refused, connection kept.
            return b"ERROR %s\r\n" % encode_text(str(exc))
        return END
