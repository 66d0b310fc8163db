"""
One queue's settings in config-file notation, both ways (C{dump_config}).

L{dump_queue_config} renders a resolved L{QueueConfig} as C{key=value} lines;
L{parse_queue_setting} reads one such value back. Each key renders and parses
as its L{QueueKey} declares.
"""

from __future__ import annotations

from typing import Any

import attrs
import yaml

from kestrel.config.schema import QUEUE_PARSERS, QueueConfig, queue_key
from kestrel.config.values import BadValueError, render_value
from kestrel.errors import ConfigError


def format_queue_setting(key: str, value: Any) -> str:
    """
    Render one resolved queue setting in config-file notation.

    Sizes and counts are plain integers (bytes), durations carry a unit
    (C{60s}, C{250ms}), C{sync_journal} is C{never}, C{always} or a period,
    booleans are C{true}/C{false}, and "none"/"unlimited" is C{null}. Every
    rendered value parses back to the same setting. The rendering is the
    field's L{QueueKey.render}.
    """
    try:
        render = queue_key(key).render
    except KeyError:
        render = render_value
    return render(value)


def dump_queue_config(config: QueueConfig) -> list[str]:
    """
    Return the C{key=value} lines of a resolved queue config, in field order.

    Values use L{format_queue_setting}. This is the body of C{dump_config}
    for one queue (see C{docs/config.md} for the framing).
    """
    return [f"{f.name}={format_queue_setting(f.name, getattr(config, f.name))}"
            for f in attrs.fields(QueueConfig)]


def parse_queue_setting(key: str, text: str) -> Any:
    """
    Parse one queue setting written as in a config file (the inverse of
    L{format_queue_setting}); raise L{ConfigError} if it is unknown or bad.
    """
    parser = QUEUE_PARSERS.get(key)
    if parser is None:
        raise ConfigError([f"{key}: unknown queue setting"])
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError([f"{key}: bad value {text!r}: {e}"]) from e
    try:
        return parser(value)
    except BadValueError as e:
        raise ConfigError([f"{key}: {e}"]) from e
