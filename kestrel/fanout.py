"""
FanoutAdds: one add to a fanout master, answered all or nothing.

An add to a master goes to the master and to each of its fanout children
(L{kestrel.collection.QueueCollection.add}). The producer is told the item
is stored only once every one of those queues holds it; if one refuses, the
producer is refused. A child that keeps refusing is logged once when it
starts and once when it accepts again, never once per add. It knows nothing
of sockets.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, DeferredList, fail, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.settled import PENDING, settled

__all__ = ["FanoutAdds"]


def _take(d: Deferred[Any]) -> object:
    """
    The result of a fired C{d} (a L{Failure} included), taken out of it, so
    that a failure counts as handled (L{settled} would leave it in C{d}).
    """
    box: list[object] = []
    d.addBoth(box.append)
    return box[0]


def _verdict(results: list[object]) -> Deferred[bool]:
    """The first failure among C{results} if any; else whether each one is C{True}."""
    for result in results:
        if isinstance(result, Failure):
            return fail(result)
    return succeed(all(result is True for result in results))


class FanoutAdds:
    """
    Combines the answers of the queues one fanout add went to (L{combine})
    and watches each child's answer (L{watch}) for the log.

    A child's refusal (C{False}: full, item too large; or a failure: its
    journal cannot be written) is logged at C{warn} the first time only; the
    end of that refusal episode (its next accepted add) is logged at C{info}
    with how many adds it refused meanwhile.
    """

    _log = Logger()

    def __init__(self) -> None:
        # Child name -> adds it refused since its refusals began.
        self._refusing: dict[str, int] = {}

    def refusing_children(self) -> list[str]:
        """The children whose latest add was refused (their refusal episode is open)."""
        return list(self._refusing)

    def forget(self, child: str) -> None:
        """Child C{child} is gone (deleted): drop its refusal episode, if open."""
        self._refusing.pop(child, None)

    def watch(self, master: str, child: str, d: Deferred[bool]) -> Deferred[bool]:
        """Return C{d} (child C{child}'s add), noting a refusal or the end of one."""
        if settled(d) is True:
            # The usual case: accepted at once, no callback.
            if child in self._refusing:
                self._accepted(master, child)
            return d
        return d.addBoth(self._outcome, master, child)

    def _outcome(self, result: object, master: str, child: str) -> object:
        if result is True:
            if child in self._refusing:
                self._accepted(master, child)
            return result
        refused = self._refusing.get(child)
        if refused is None:
            reason = (result.getErrorMessage() if isinstance(result, Failure)
                      else "the queue is full or the item too large")
            self._log.warn("Fanout child {child} refused an add to {master} ({reason}); "
                           "adds to {master} are refused while it does",
                           child=child, master=master, reason=reason)
            refused = 0
        self._refusing[child] = refused + 1
        return result

    def _accepted(self, master: str, child: str) -> None:
        refused = self._refusing.pop(child)
        self._log.info("Fanout child {child} of {master} accepts adds again "
                       "({count} refused meanwhile)", child=child, master=master, count=refused)

    def combine(self, adds: list[Deferred[bool]]) -> Deferred[bool]:
        """
        One answer for the adds of one item: fires once all of C{adds} have,
        with the first failure among them, else C{True} only if each is C{True}.
        """
        if all(settled(d) is not PENDING for d in adds):
            return _verdict([_take(d) for d in adds])
        return DeferredList(adds, consumeErrors=True).addCallback(
            lambda results: _verdict([value for _ok, value in results]))
