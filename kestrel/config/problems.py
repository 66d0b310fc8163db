"""
Problems of one config source, collected so that all of them are reported at once.

Each problem names its source, its line (when known) and the dotted key path
(C{queues.weather.max_items}); L{Problems.raise_if_any} turns them into one
L{ConfigError}, ordered by line.
"""

from __future__ import annotations

import yaml

from kestrel.errors import ConfigError


class Problems:
    """Collects every problem of one config source, each with key path and line."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[tuple[int, str]] = []

    def add(self, node: yaml.Node | int | None, path: str, message: str) -> None:
        """Record a problem at C{path}; C{node} (or a 0-based line) locates it."""
        line = node.start_mark.line if isinstance(node, yaml.Node) else node
        where = self.source if line is None else f"{self.source}:{line + 1}"
        text = f"{where}: {path}: {message}" if path else f"{where}: {message}"
        self.items.append((-1 if line is None else line, text))

    def raise_if_any(self) -> None:
        """Raise one L{ConfigError} with every problem, ordered by line."""
        if self.items:
            raise ConfigError([text for _, text in sorted(self.items, key=lambda i: i[0])])


def join_path(path: str, key: str) -> str:
    """The dotted path of C{key} inside C{path} (the root's path is empty)."""
    return f"{path}.{key}" if path else key
