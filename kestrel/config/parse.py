"""
Reading a config file: the YAML walk that turns a document into a checked L{ServerConfig}.

L{parse_config} is pure (no I/O): it checks the whole document and raises one
L{ConfigError} listing every problem, each naming its dotted key path and
line. L{load_config} reads a file and parses it. Which keys exist and how
each is parsed comes from the schema (L{kestrel.config.schema}).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, NoReturn

import attrs
import yaml
from twisted.logger import Logger

from kestrel.config.problems import Problems, join_path
from kestrel.config.schema import (
    DEFAULT_CONFIG,
    QUEUE_PARSERS,
    SERVER_PARSERS,
    ZOOKEEPER_PARSERS,
    QueueConfig,
    QueueOverride,
    ServerConfig,
    ZooKeeperConfig,
    check_server,
)
from kestrel.config.values import BadValueError, Parser, describe_node, parse_queue_name
from kestrel.errors import ConfigError, InvalidQueueName
from kestrel.names import validate_queue_name

_log = Logger(namespace="kestrel.config")


class _Walker:
    """Turns a composed YAML document into checked Python values, noting problems."""

    def __init__(self, loader: yaml.SafeLoader, problems: Problems) -> None:
        self.loader = loader
        self.problems = problems
        #: 0-based line of every key seen, by dotted path.
        self.lines: dict[str, int] = {}

    def value(self, node: yaml.Node) -> Any:
        """The Python value of a node (anchors and tags resolved as YAML does)."""
        return self.loader.construct_object(node, deep=True)

    def entries(self, node: yaml.Node, path: str) -> Iterator[tuple[str, yaml.Node, yaml.Node]]:
        """
        Yield (key, key node, value node) of a mapping node, once per key.

        Merge keys (C{<<: *anchor}) are applied; a key given twice is a
        problem; a non-mapping node is a problem and yields nothing.
        """
        if not isinstance(node, yaml.MappingNode):
            self.problems.add(node, path, f"expected a mapping, got {describe_node(node)}")
            return
        explicit = {id(k) for k, _ in node.value}
        try:
            self.loader.flatten_mapping(node)
        except yaml.YAMLError as e:
            self.problems.add(node, path, f"bad merge key: {e}")
            return
        chosen: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        from_explicit: set[str] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                self.problems.add(key_node, path, "keys must be plain names")
                continue
            key = key_node.value
            if id(key_node) in explicit or join_path(path, key) not in self.lines:
                self.lines[join_path(path, key)] = key_node.start_mark.line
            if id(key_node) in explicit:
                if key in from_explicit:
                    self.problems.add(key_node, join_path(path, key), "duplicate key")
                    continue
                from_explicit.add(key)
            chosen[key] = (key_node, value_node)
        for key, (key_node, value_node) in chosen.items():
            yield key, key_node, value_node

    def scalar(self, node: yaml.Node, path: str,
               parser: Parser) -> tuple[bool, Any]:
        """Parse one value; return (ok, value), noting a problem when not ok."""
        try:
            return True, parser(self.value(node))
        except BadValueError as e:
            self.problems.add(node, path, str(e))
        except yaml.YAMLError as e:
            self.problems.add(node, path, f"bad value: {e}")
        return False, None

    def queue_settings(self, node: yaml.Node, path: str) -> dict[str, Any]:
        """The explicitly set queue keys of a C{default:} or C{queues.<q>:} mapping."""
        settings: dict[str, Any] = {}
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
            return settings
        for key, key_node, value_node in self.entries(node, path):
            parser = QUEUE_PARSERS.get(key)
            if parser is None:
                self.problems.add(key_node, join_path(path, key), "unknown queue setting")
                continue
            ok, value = self.scalar(value_node, join_path(path, key), parser)
            if ok:
                settings[key] = value
        return settings


def parse_config(text: str, source: str = "<string>") -> ServerConfig:
    """
    Parse and check a YAML config document; return the resulting ServerConfig.

    Every key is optional (an empty document gives L{DEFAULT_CONFIG}). All
    problems of the document are collected and raised together as one
    L{ConfigError}; each names C{source}, its line and the dotted key path
    (C{queues.weather.max_items}). Non-fatal remarks (aliases masking queues,
    C{durable_acks} without fsync) end up in C{warnings} and are logged.
    Pure: reads no file and touches nothing.
    """
    problems = Problems(source)
    try:
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as e:
        _syntax_error(problems, text, e)
    try:
        try:
            root = loader.get_single_node()
        except yaml.YAMLError as e:
            _syntax_error(problems, text, e)
        config, lines = _build(_Walker(loader, problems), root)
    finally:
        loader.dispose()
    check_server(config, problems, lines)
    problems.raise_if_any()
    warnings = _warnings(config)
    for warning in warnings:
        _log.warn("{source}: {warning}", source=source, warning=warning)
    return attrs.evolve(config, warnings=warnings)


def _syntax_error(problems: Problems, text: str, error: yaml.YAMLError) -> NoReturn:
    """Raise a L{ConfigError} for a document that is not YAML at all, with its line."""
    if isinstance(error, yaml.reader.ReaderError):
        line: int | None = text.count("\n", 0, error.position)
        character = error.character
        if isinstance(character, int):
            character = chr(character)
        message = f"character {character!r} is not allowed in YAML ({error.reason})"
    else:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        line = mark.line if mark is not None else None
        message = str(getattr(error, "problem", None) or error)
    problems.add(line, "", f"YAML syntax error: {message}")
    problems.raise_if_any()
    raise AssertionError("unreachable")  # pragma: no cover


def _build(walker: _Walker, root: yaml.Node | None) -> tuple[ServerConfig, dict[str, int]]:
    """Build a ServerConfig from the root node; also return each top-level key's line."""
    problems = walker.problems
    fields: dict[str, Any] = {}
    lines = walker.lines
    if root is None or (isinstance(root, yaml.ScalarNode)
                        and root.tag == "tag:yaml.org,2002:null"):
        return DEFAULT_CONFIG, lines
    for key, key_node, value_node in walker.entries(root, ""):
        if key in SERVER_PARSERS:
            ok, value = walker.scalar(value_node, key, SERVER_PARSERS[key])
            if ok:
                fields[key] = value
        elif key == "zookeeper":
            fields[key] = _build_zookeeper(walker, value_node)
        elif key == "default":
            fields[key] = QueueOverride(walker.queue_settings(value_node, key)).apply(QueueConfig())
        elif key == "queues":
            fields[key] = _build_queues(walker, value_node)
        elif key == "aliases":
            fields[key] = _build_aliases(walker, value_node)
        else:
            problems.add(key_node, key, "unknown setting")
    return ServerConfig(**fields), lines


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"


def _build_zookeeper(walker: _Walker, node: yaml.Node) -> ZooKeeperConfig | None:
    """The C{zookeeper:} section: null, or host, path_prefix and optional port/session_timeout."""
    if _is_null(node):
        return None
    values: dict[str, Any] = {}
    complete = isinstance(node, yaml.MappingNode)
    for key, key_node, value_node in walker.entries(node, "zookeeper"):
        path = join_path("zookeeper", key)
        parser = ZOOKEEPER_PARSERS.get(key)
        if parser is None:
            walker.problems.add(key_node, path, "unknown zookeeper setting")
            complete = False
            continue
        ok, value = walker.scalar(value_node, path, parser)
        if ok:
            values[key] = value
        complete = complete and ok
    if not isinstance(node, yaml.MappingNode):
        return None
    present = {k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
    for key in ("host", "path_prefix"):
        if key not in present:
            walker.problems.add(node, join_path("zookeeper", key), "required when zookeeper is set")
            complete = False
    prefix = values.get("path_prefix")
    if prefix is not None and not prefix.startswith("/"):
        walker.problems.add(node, "zookeeper.path_prefix",
                            f"must be an absolute ZooKeeper path starting with '/', got {prefix!r}")
        complete = False
    return ZooKeeperConfig(**values) if complete else None


def _named_entries(walker: _Walker, node: yaml.Node, section: str,
                   what: str) -> Iterator[tuple[str, str, yaml.Node]]:
    """
    Yield C{(name, key path, value node)} for each entry of the C{queues:} or
    C{aliases:} mapping C{node} whose name is a legal queue name; note a
    problem (C{bad <what> name}) for each other entry. A null section is empty.
    """
    if _is_null(node):
        return
    for name, key_node, value_node in walker.entries(node, section):
        path = join_path(section, name)
        try:
            validate_queue_name(name)
        except InvalidQueueName as e:
            walker.problems.add(key_node, path, f"bad {what} name: {e}")
            continue
        yield name, path, value_node


def _build_queues(walker: _Walker, node: yaml.Node) -> dict[str, QueueOverride]:
    """The C{queues:} section: queue name -> its explicitly set keys."""
    return {name: QueueOverride(walker.queue_settings(value_node, path))
            for name, path, value_node in _named_entries(walker, node, "queues", "queue")}


def _build_aliases(walker: _Walker, node: yaml.Node) -> dict[str, tuple[str, ...]]:
    """The C{aliases:} section: alias name -> destination queue names (a non-empty list)."""
    aliases: dict[str, tuple[str, ...]] = {}
    for name, path, value_node in _named_entries(walker, node, "aliases", "alias"):
        if not isinstance(value_node, yaml.SequenceNode) or not value_node.value:
            walker.problems.add(value_node, path,
                                "expected a non-empty list of destination queue names")
            continue
        destinations: list[str] = []
        for i, item in enumerate(value_node.value):
            ok, destination = walker.scalar(item, f"{path}[{i}]", parse_queue_name)
            if ok:
                destinations.append(destination)
        if len(destinations) == len(value_node.value):
            aliases[name] = tuple(destinations)
    return aliases



def _warnings(config: ServerConfig) -> tuple[str, ...]:
    """Non-fatal remarks on a valid config."""
    warnings: list[str] = []
    masked = sorted(set(config.queues) & set(config.aliases))
    if masked:
        warnings.append(f"queue name(s) masked by alias(es): {', '.join(masked)}")
    for path, queue in [("default", config.default)] + [
        (join_path("queues", name), config.queue_config(name)) for name in sorted(config.queues)
    ]:
        if queue.durable_acks and queue.sync_journal is None and queue.keep_journal:
            warnings.append(f"{path}: durable_acks has no effect with sync_journal: never "
                            "(writes are acknowledged without waiting for an fsync)")
    return tuple(warnings)


def load_config(path: str | os.PathLike[str]) -> ServerConfig:
    """
    Read the YAML config file at C{path} and parse it with L{parse_config}.

    Raises L{ConfigError} for an unreadable file as for a bad one. Relative
    paths inside the file are relative to the server's working directory,
    not to the file.
    """
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"{source}: cannot read config file: {e}"]) from e
    return parse_config(text, source=source)

