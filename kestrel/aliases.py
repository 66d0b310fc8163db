"""
Aliases: configured names whose adds go to every one of their destination
queues (Kestrel's C{AliasedQueue}), and the table of them a config sets up.
They store nothing and know nothing of sockets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from twisted.logger import Logger

from kestrel.stats import StatList

__all__ = ["AliasedQueue", "all_true", "apply_aliases"]

_log = Logger(namespace="kestrel.collection")


class AliasedQueue:
    """
    A configured name whose adds go to every destination queue.

    It stores nothing itself. C{put_items} and C{put_bytes} count every add
    (even one that a destination refused), as Kestrel's C{AliasedQueue}.
    """

    def __init__(self, name: str, destinations: Iterable[str], create_time: float) -> None:
        self.name = name
        self.destinations: tuple[str, ...] = tuple(destinations)
        self.create_time = create_time
        self.put_items = 0
        self.put_bytes = 0

    def dump_stats(self) -> StatList:
        """Kestrel's alias stats: C{put_items}, C{put_bytes}, C{children}."""
        return [
            ("put_items", str(self.put_items)),
            ("put_bytes", str(self.put_bytes)),
            ("children", ",".join(self.destinations)),
        ]


def all_true(results: list[tuple[bool, Any]]) -> bool:
    """Fold a DeferredList's results: true only if every add succeeded with True."""
    return all(ok and value for ok, value in results)


def apply_aliases(table: dict[str, AliasedQueue], aliases: Mapping[str, Iterable[str]],
                  queue_names: Iterable[str], now: float) -> None:
    """
    Make C{table} hold exactly the aliases C{aliases} (name -> destinations):
    new ones are created (at C{now}), gone ones removed, others get their
    new destinations (their counters kept). Names also configured as queues
    (C{queue_names}) are masked by the alias: that is logged.
    """
    wanted = dict(aliases)
    masked = sorted(set(wanted) & set(queue_names))
    if masked:
        _log.warn("queue name(s) masked by alias(es): {names}", names=", ".join(masked))
    for name in list(table):
        if name not in wanted:
            del table[name]
            _log.info("Removed alias {alias}", alias=name)
    for name, destinations in wanted.items():
        alias = table.get(name)
        if alias is None:
            table[name] = AliasedQueue(name, destinations, now)
            _log.info("Setting up alias {alias}: {destinations}", alias=name,
                      destinations=list(destinations))
        else:
            alias.destinations = tuple(destinations)
