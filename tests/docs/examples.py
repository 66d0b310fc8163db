"""
Finds the examples the documentation marks as tested, and runs them.

The convention (documented in docs/writing-docs.md, "Tested examples"): a fenced
code block right after an HTML comment that starts with C{<!-- doctest} is
run; every other block is prose. The comment's first line may carry options
(C{key=value}, values without blanks), and its further lines are hidden setup
commands that run first, in the same shell:

    <!-- doctest ports=22133 files=etc/kestrel.yaml timeout=60
    kestrel-docs-journal kestrel-data/jobs add:hello
    -->
    ```sh
    kestrel-qdump kestrel-data/jobs
    ```

A C{python} block runs in the Python that runs the tests. A block whose
lines start with C{$ } is a transcript: each C{$ } command runs
and its standard output must be the lines that follow it. Any other block is a
script that must exit 0; if the next fenced block follows a
C{<!-- doctest-output -->} comment, the script's output must be that block.
Output is compared line by line after dropping what a carriage return
overwrote and trailing blanks.

Every example runs with C{bash -euo pipefail} in a fresh empty directory,
with this Python's scripts and C{tests/docs/bin} first on C{PATH} and the
checkout on C{PYTHONPATH}. Options: C{timeout} (seconds, default 60),
C{ports} (comma-separated: skipped when one is taken here, since the example
needs it), C{files} (comma-separated repository files copied in at the same
relative paths), C{name} (the test's id).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(__file__).resolve().parent / "bin"

#: The documents that may hold tested examples.
DOCUMENTS = ["README.md", "docs/*.md"]

_MARKER = re.compile(r"^<!--\s*doctest(?P<rest>(?:\s.*)?)$")
_OUTPUT_MARKER = re.compile(r"^<!--\s*doctest-output\s*-->\s*$")
_FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<info>[^`]*)$")


@dataclass
class Example:
    """One marked block: where it is, its options, hidden setup, body and expected output."""

    path: str
    line: int
    options: dict[str, str]
    setup: str
    body: str
    expected_output: str | None = None
    transcript: list[tuple[str, str]] = field(default_factory=list)

    @property
    def id(self) -> str:
        """The test id: C{name} if given, else C{file:line}."""
        return self.options.get("name", f"{self.path}:{self.line}")


def _fenced(lines: list[str], start: int) -> tuple[str, int, str] | None:
    """
    The block whose opening fence is at or after C{start} (blank lines skipped):
    its text, the index after its closing fence, and its info string.
    """
    i = start
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines):
        return None
    opening = _FENCE.match(lines[i])
    if opening is None:
        return None
    fence = opening["fence"]
    body = []
    for j in range(i + 1, len(lines)):
        if lines[j].rstrip() == fence:
            return "".join(line + "\n" for line in body), j + 1, opening["info"].strip()
        body.append(lines[j])
    raise ValueError(f"unclosed fence at line {i + 1}")


def parse(text: str, path: str) -> list[Example]:
    """Every marked example of a Markdown text, in order. Raises ValueError on a bad marker."""
    lines = text.splitlines()
    examples = []
    i = 0
    while i < len(lines):
        marker = _MARKER.match(lines[i])
        if marker is None:
            if _FENCE.match(lines[i]):  # an unmarked block: prose, even if it shows a marker
                skipped = _fenced(lines, i)
                assert skipped is not None
                i = skipped[1]
            else:
                i += 1
            continue
        line_no = i + 1
        rest = marker["rest"].strip()
        setup: list[str] = []
        if rest.endswith("-->"):
            rest = rest[:-3].strip()
        else:
            i += 1
            while i < len(lines) and lines[i].strip() != "-->":
                setup.append(lines[i])
                i += 1
            if i == len(lines):
                raise ValueError(f"{path}:{line_no}: doctest comment is not closed")
        options = {}
        for word in shlex.split(rest):
            key, sep, value = word.partition("=")
            if not sep or key not in ("timeout", "ports", "files", "name"):
                raise ValueError(f"{path}:{line_no}: unknown doctest option {word!r}")
            options[key] = value
        block = _fenced(lines, i + 1)
        if block is None:
            raise ValueError(f"{path}:{line_no}: doctest comment without a fenced block")
        body, i, info = block
        if info.split()[:1] in (["python"], ["py"]):  # a Python example runs in this Python
            body = f'"$KESTREL_DOCS_PYTHON" - <<\'DOCTEST_EOF\'\n{body}DOCTEST_EOF\n'
        example = Example(path, line_no, options, "\n".join(setup) + "\n", body)
        if any(line.startswith("$ ") for line in body.splitlines()):
            example.transcript = _transcript(body)
        j = i
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j < len(lines) and _OUTPUT_MARKER.match(lines[j]):
            output = _fenced(lines, j + 1)
            if output is None:
                raise ValueError(f"{path}:{j + 1}: doctest-output without a fenced block")
            example.expected_output, i, _info = output
        examples.append(example)
    return examples


def _transcript(body: str) -> list[tuple[str, str]]:
    """The (command, expected output) pairs of a C{$ } transcript."""
    steps: list[tuple[str, str]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], ""))
        elif steps:
            command, output = steps[-1]
            steps[-1] = (command, output + line + "\n")
        elif line.strip():
            raise ValueError(f"transcript output before any command: {line!r}")
    return steps


def all_examples() -> list[Example]:
    """The marked examples of every document, README first."""
    found = []
    for pattern in DOCUMENTS:
        for path in sorted(ROOT.glob(pattern)):
            found.extend(parse(path.read_text(), str(path.relative_to(ROOT))))
    return found


def normalized(text: str) -> list[str]:
    """
    Lines as a terminal shows them: line ends may be CRLF; what a carriage
    return inside a line overwrote, and trailing blanks, go.
    """
    return [line.rstrip("\r").rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]


def busy_ports(example: Example) -> list[int]:
    """The C{ports} of the example that something on this machine already listens on."""
    busy = []
    for text in filter(None, example.options.get("ports", "").split(",")):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", int(text))) == 0:
                busy.append(int(text))
    return busy


def environment() -> dict[str, str]:
    """The environment of an example: this Python's scripts and the helpers first on PATH."""
    env = dict(os.environ)
    scripts = Path(sys.executable).parent
    env["PATH"] = os.pathsep.join([str(BIN), str(scripts), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["KESTREL_DOCS_PYTHON"] = sys.executable
    return env


def run_script(script: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """
    Run C{script} with C{bash -euo pipefail} in C{cwd}, in its own process group;
    whatever it left running (a server in the background) is stopped afterwards.
    """
    # Bytes, decoded here: text mode would turn a carriage return into a new line.
    process = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=cwd,
                               env=environment(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    status = None
    try:
        out, err = process.communicate(timeout=timeout)
        status = process.returncode
    except subprocess.TimeoutExpired:
        _stop_group(process.pid)
        out, err = process.communicate()
        err += f"\n(timed out after {timeout} s)".encode()
    _stop_group(process.pid)
    return subprocess.CompletedProcess(process.args, -1 if status is None else status,
                                       out.decode("utf-8", "replace"),
                                       err.decode("utf-8", "replace"))


def _stop_group(pgid: int) -> None:
    """SIGTERM the example's process group (its leftovers), then SIGKILL what remains."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        for _ in range(50):
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)  # another process's exit: there is no clock to inject here
