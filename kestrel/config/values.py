"""
The values of a config file: how each kind of setting is parsed and rendered.

Every parser takes the Python value YAML produced and returns the checked
setting, or raises L{BadValueError} (a C{ValueError}) whose message says what
was expected. Every renderer writes a setting back in config-file notation
that parses to the same value. Nothing here knows which key takes which kind:
that is the schema's business (L{kestrel.config.schema}).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import yaml

from kestrel.errors import ForbiddenStatus, InvalidQueueName, UnknownStatus
from kestrel.names import validate_queue_name
from kestrel.status import Status, parse_settable_status

#: Sync policy: None = never fsync on write, 0.0 = fsync every write, > 0 = period in seconds.
SyncPolicy = float | None

#: A parser: the value YAML produced in, the checked setting out (or L{BadValueError}).
Parser = Callable[[object], Any]


class BadValueError(ValueError):
    """A value that does not fit its key; the message says what was expected."""


_SIZE_UNITS = {
    "": 1, "b": 1, "byte": 1, "bytes": 1,
    "kb": 1024, "kib": 1024,
    "mb": 1024 ** 2, "mib": 1024 ** 2,
    "gb": 1024 ** 3, "gib": 1024 ** 3,
}
_DURATION_UNITS: dict[str, int | Fraction] = {
    "": 1, "ms": Fraction(1, 1000), "s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZE_EXPECTED = "expected a size: bytes, or a string like '512KiB', '16MiB', '1GiB'"
_DURATION_EXPECTED = "expected a duration like '250ms', '30s', '5m', '1h', '1d' or seconds"
_STATUS_EXPECTED = "expected up, readonly, quiescent or writeavoid"
_NUMBER_WITH_UNIT = re.compile(
    r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*\Z")


def describe(value: object) -> str:
    """A short description of a bad value for an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return repr(value)


def describe_node(node: yaml.Node) -> str:
    """A short description of a YAML node for an error message (never fails)."""
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if node.tag == "tag:yaml.org,2002:null":
        return "null"
    return repr(node.value)


def parse_size(value: object) -> int:
    """
    Return the size C{value} in bytes.

    An integer is bytes; a string is a number and a unit, C{B}/C{bytes},
    C{KiB}/C{KB}, C{MiB}/C{MB}, C{GiB}/C{GB} (all powers of 1024; units are
    case-insensitive, C{1.5KiB} is allowed if it comes to whole bytes). Raises
    C{ValueError} for anything else, including negative sizes.
    """
    if isinstance(value, bool):
        raise BadValueError(f"{_SIZE_EXPECTED}, got {describe(value)}")
    if isinstance(value, int):
        amount = Fraction(value)
    elif isinstance(value, str):
        match = _NUMBER_WITH_UNIT.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _SIZE_UNITS:
            raise BadValueError(f"{_SIZE_EXPECTED}, got {value!r}")
        amount = Fraction(match.group(1)) * _SIZE_UNITS[unit]
    else:
        raise BadValueError(f"{_SIZE_EXPECTED}, got {describe(value)}")
    if amount < 0:
        raise BadValueError(f"a size cannot be negative, got {value!r}")
    if amount.denominator != 1:
        raise BadValueError(f"a size must come to a whole number of bytes, got {value!r}")
    return int(amount)


def parse_duration(value: object) -> float:
    """
    Return the duration C{value} in seconds (a float).

    A number is seconds; a string is a number with an optional unit, C{ms},
    C{s}, C{m}, C{h} or C{d} (case-sensitive: C{250ms}, C{30s}, C{1.5h}). Raises
    C{ValueError} for anything else, including negative or infinite values.
    C{null} is handled by the caller (it means "none" for optional keys).
    """
    if isinstance(value, bool):
        raise BadValueError(f"{_DURATION_EXPECTED}, got {describe(value)}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise BadValueError(f"a duration must be finite, got {value!r}")
        seconds = float(value)
    elif isinstance(value, str):
        match = _NUMBER_WITH_UNIT.match(value)
        if match is None or match.group(2) not in _DURATION_UNITS:
            raise BadValueError(f"{_DURATION_EXPECTED}, got {value!r}")
        seconds = float(Fraction(match.group(1)) * _DURATION_UNITS[match.group(2)])
    else:
        raise BadValueError(f"{_DURATION_EXPECTED}, got {describe(value)}")
    if seconds < 0:
        raise BadValueError(f"a duration cannot be negative, got {value!r}")
    return seconds


def parse_sync_policy(value: object) -> SyncPolicy:
    """
    Return the C{sync_journal} policy of C{value}.

    C{never} (or C{null}) gives None (no fsync on write), C{always} gives 0.0
    (fsync every write), a duration gives its period in seconds (a zero
    duration is the same as C{always}). Raises C{ValueError} otherwise.
    """
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in ("never", "always"):
        return None if value.strip().lower() == "never" else 0.0
    try:
        return parse_duration(value)
    except BadValueError:
        raise BadValueError("expected never, always or a duration (fsync period) "
                             f"like '100ms', got {describe(value)}") from None


def _parse_int(value: object, what: str) -> int:
    """An integer (a decimal string is accepted too), for counts and ports."""
    if isinstance(value, bool):
        raise BadValueError(f"expected {what}, got {describe(value)}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    raise BadValueError(f"expected {what}, got {describe(value)}")


def parse_count(value: object) -> int:
    """A non-negative integer."""
    number = _parse_int(value, "a whole number")
    if number < 0:
        raise BadValueError(f"cannot be negative, got {number}")
    return number


def parse_port(value: object) -> int | None:
    """A TCP port; 0 or null disables the listener (None)."""
    if value is None:
        return None
    number = _parse_int(value, "a port number (0 or null: disabled)")
    if not 0 <= number <= 65535:
        raise BadValueError(f"a port must be between 0 and 65535, got {number}")
    return number or None


def parse_file_mode(value: object) -> int:
    """A permission mode: an octal string (C{"0600"}, C{"600"}) or an integer (C{0o600})."""
    if isinstance(value, str) and re.fullmatch(r"\s*0?o?[0-7]{3}\s*", value):
        number = int(value.strip().replace("o", ""), 8)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise BadValueError(f"expected a permission mode like '0600', got {describe(value)}")
    if not 0 <= number <= 0o777:
        raise BadValueError(f"a permission mode must be between 0000 and 0777 (quote it: "
                             f"'0600'), got {value!r}")
    return number


def parse_control_commands(value: object) -> str:
    """C{all} or C{admin_only}."""
    if value not in ("all", "admin_only"):
        raise BadValueError(f"expected all or admin_only, got {describe(value)}")
    return str(value)


def parse_journal_fsync(value: object) -> str:
    """C{reactor} or C{thread}."""
    if value not in ("reactor", "thread"):
        raise BadValueError(f"expected reactor or thread, got {describe(value)}")
    return str(value)


def parse_zk_port(value: object) -> int:
    """A TCP port between 1 and 65535."""
    number = _parse_int(value, "a port number")
    if not 1 <= number <= 65535:
        raise BadValueError(f"a port must be between 1 and 65535, got {number}")
    return number


def parse_boolean(value: object) -> bool:
    """A YAML boolean (true/false, yes/no, on/off)."""
    if not isinstance(value, bool):
        raise BadValueError(f"expected true or false, got {describe(value)}")
    return value


def parse_text(value: object) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise BadValueError(f"expected a non-empty string, got {describe(value)}")
    return value


def parse_queue_name(value: object) -> str:
    """A valid queue name."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    name = parse_text(value)
    try:
        return validate_queue_name(name)
    except InvalidQueueName as e:
        raise BadValueError(str(e)) from None


def parse_status(value: object) -> Status:
    """A status a server may start in: up, readonly, quiescent or writeavoid."""
    if not isinstance(value, (str, Status)):
        raise BadValueError(f"{_STATUS_EXPECTED}, got {describe(value)}")
    try:
        return parse_settable_status(value)
    except UnknownStatus:
        raise BadValueError(f"{_STATUS_EXPECTED}, got {value!r}") from None
    except ForbiddenStatus:
        raise BadValueError("down cannot be a default status "
                       "(use up, readonly, quiescent or writeavoid)") from None


def optional(parser: Parser) -> Parser:
    """The same parser, with null meaning None."""

    def parse(value: object) -> Any:
        return None if value is None else parser(value)

    return parse


def required(parser: Parser) -> Parser:
    """The same parser, refusing null."""

    def parse(value: object) -> Any:
        if value is None:
            raise BadValueError("cannot be null here")
        return parser(value)

    return parse


def positive(parser: Parser) -> Parser:
    """The same parser, refusing zero."""

    def parse(value: object) -> Any:
        result = parser(value)
        if result is not None and result <= 0:
            raise BadValueError(f"must be greater than zero, got {describe(value)}")
        return result

    return parse


def zero_if_null(parser: Callable[[object], float]) -> Callable[[object], float]:
    """The same parser, with null meaning 0."""

    def parse(value: object) -> float:
        return 0.0 if value is None else parser(value)

    return parse


# -- renderers (config-file notation) ---------------------------------------------------------


def render_duration(seconds: float) -> str:
    """A duration in the config's own notation (C{250ms}, C{60s}), exact and re-parsable."""
    candidates = []
    if 0 < seconds < 1:
        candidates.append(f"{round(seconds * 1000)}ms")
    if seconds == int(seconds):
        candidates.append(f"{int(seconds)}s")
    for text in candidates:
        if parse_duration(text) == seconds:
            return text
    return f"{seconds!r}s"


def render_value(value: Any) -> str:
    """
    A setting in config-file notation: integers plain, durations with a unit,
    booleans C{true}/C{false}, None as C{null}, and strings quoted when YAML
    would read them back as something else.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return render_duration(value)
    if isinstance(value, str) and yaml.safe_load(value) != value:
        return json.dumps(value)  # quoted: "no", "123" or "null" would read back as non-strings
    return str(value)


def render_sync_policy(value: SyncPolicy) -> str:
    """C{never}, C{always} or the fsync period."""
    if value is None:
        return "never"
    if value == 0:
        return "always"
    return render_duration(value)

