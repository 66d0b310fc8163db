"""
The documentation's tested examples run and do what the text says.

Which blocks run, and how, is the convention of L{tests.docs.examples}
(explained for writers in docs/writing-docs.md): only blocks marked with a
C{<!-- doctest -->} comment, so adding prose or untested blocks never breaks
this test, while a marked example that stops working fails it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.docs.examples import (
    ROOT,
    Example,
    all_examples,
    busy_ports,
    normalized,
    parse,
    run_script,
)

EXAMPLES = all_examples()


def _prepare(example: Example, tmp_path: Path) -> None:
    for name in filter(None, example.options.get("files", "").split(",")):
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, target)


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_example(example: Example, tmp_path: Path) -> None:
    """A marked example exits 0 and prints what the document shows, if it shows output."""
    busy = busy_ports(example)
    if busy:
        pytest.skip(f"{example.id} needs ports {busy}, in use on this machine")
    _prepare(example, tmp_path)
    timeout = float(example.options.get("timeout", 60))
    steps = example.transcript or [(example.body, example.expected_output)]
    # One shell for the hidden setup and every step, so that what the setup
    # started (a server) serves the steps; each step's output goes to its own file.
    script = [f"{{\n:\n{example.setup}}} > .doctest-setup.out"]
    for n, (command, _expected) in enumerate(steps):
        script.append(f"echo {n} > .doctest-step\n{{\n{command}\n}} > .doctest-{n}.out")
    done = run_script("\n".join(script) + "\nrm .doctest-step\n", tmp_path,
                      timeout * (len(steps) + 1))
    step = (tmp_path / ".doctest-step")
    if done.returncode != 0:
        where = (f"step `{steps[int(step.read_text())][0]}`" if step.exists()
                 else "the hidden setup")
        pytest.fail(f"{example.id}: {where} failed (status {done.returncode}):\n{done.stderr}")
    for n, (command, expected) in enumerate(steps):
        if expected is not None:
            output = (tmp_path / f".doctest-{n}.out").read_bytes().decode("utf-8", "replace")
            assert normalized(output) == normalized(expected), f"{example.id}: `{command}`"


def test_the_documents_have_tested_examples() -> None:
    """The README's quick look and the journal tools' recipes are among the tested examples."""
    ids = {e.id for e in EXAMPLES}
    assert {"readme-quick-look", "qdump-example", "qpack-recipe"} <= ids


def test_only_marked_blocks_run() -> None:
    """Unmarked blocks are prose; a marker's options, setup, transcript and output are parsed."""
    text = """\
```sh
rm -rf /
```
<!-- doctest name=one timeout=5
echo hidden
-->
```sh
echo shown
```
<!-- doctest-output -->
```
shown
```
<!-- doctest -->
```
$ echo a
a
$ printf 'b\\\\n'
b
```
"""
    first, second = parse(text, "x.md")
    assert (first.id, first.options, first.setup) == ("one", {"name": "one", "timeout": "5"},
                                                       "echo hidden\n")
    assert (first.body, first.expected_output) == ("echo shown\n", "shown\n")
    assert second.id == "x.md:14"
    assert second.transcript == [("echo a", "a\n"), ("printf 'b\\\\n'", "b\n")]


@pytest.mark.parametrize("text", [
    "<!-- doctest bogus=1 -->\n```\nx\n```\n",
    "<!-- doctest -->\nno block\n",
    "<!-- doctest\nsetup never closed\n",
])
def test_bad_markers_are_errors(text: str) -> None:
    """A marker with an unknown option, no block, or no end is an error, not a silent skip."""
    with pytest.raises(ValueError):
        parse(text, "x.md")


def test_normalized_drops_carriage_return_overwrites() -> None:
    """Kestrel's tools erase progress with a carriage return; comparison sees the terminal."""
    assert normalized("\r" + " " * 30 + "\nDone. x  \n") == ["", "Done. x", ""]
    assert normalized("STORED\r\nEND\r\n") == ["STORED", "END", ""]


def test_marker_shown_inside_a_block_is_prose() -> None:
    """A page may show the marker itself inside a longer fence; that does not run."""
    text = "````markdown\n<!-- doctest -->\n```\necho no\n```\n````\n"
    assert parse(text, "x.md") == []
