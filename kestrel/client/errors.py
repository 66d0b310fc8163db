"""Errors raised (as Deferred failures) by the fleet client."""

from __future__ import annotations

from collections.abc import Sequence

from kestrel.errors import KestrelError


class ClientError(KestrelError):
    """Base class of every error the client reports."""


class ServerRefused(ClientError):
    """A server refused the request (C{SERVER_ERROR}, C{NOT_STORED}) or went away."""

    def __init__(self, server: str, reason: str) -> None:
        super().__init__(f"{server}: {reason}")
        self.server = server
        self.reason = reason


class ProtocolError(ClientError):
    """A server answered something the client cannot understand; the connection is dropped."""


class RequestTimeout(ClientError):
    """A network wait (connect or reply) took longer than its timeout."""


class ConnectionGone(ClientError):
    """The connection closed before the reply arrived."""


class NoServers(ClientError):
    """No server is known in the set the operation needs."""


class AllServersFailed(ClientError):
    """
    Every server was tried and none accepted the operation.

    C{attempts} lists C{(server, reason)} for each server tried, in order.
    """

    def __init__(self, what: str, attempts: Sequence[tuple[str, str]]) -> None:
        detail = "; ".join(f"{server}: {reason}" for server, reason in attempts)
        super().__init__(f"{what} failed on every server ({detail or 'none known'})")
        self.attempts = list(attempts)


class HandleClosed(ClientError):
    """C{confirm()} or C{abort()} on a handle that is already settled or whose connection died."""
