"""docs/tools.md's qpack recipe also packs the rotated files, oldest first, and removes them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.docs.examples import all_examples, environment, run_script


def test_qpack_recipe_with_rotated_files(tmp_path: Path) -> None:
    """Rotated files and the live one become one journal holding the queue's end state."""
    recipe = next(e for e in all_examples() if e.id == "qpack-recipe")
    setup = ("kestrel-docs-journal kestrel-data/jobs.1767225600000 add:a add:b\n"
             "kestrel-docs-journal kestrel-data/jobs.1767225700000 remove add:c\n"
             "kestrel-docs-journal kestrel-data/jobs add:d open:1\n"
             "kestrel-docs-journal kestrel-data/other add:z\n")
    assert run_script(setup, tmp_path, 30).returncode == 0
    done = run_script(recipe.body, tmp_path, 60)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "kestrel-data").iterdir()) == ["jobs", "other"]
    dump = subprocess.run(["kestrel-qdump", "-Q", "kestrel-data/jobs"], cwd=tmp_path,
                          env=environment(), capture_output=True, timeout=60)
    assert dump.returncode == 0, dump.stderr
    # b is the open read (it comes back at the head on replay); c and d are queued.
    assert dump.stdout.split(b"\n")[1:] == [b"Journal size: 76 bytes, with 5 operations.",
                                             b"3 items totalling 3 bytes.", b"c", b"d", b""]


def test_qpack_recipe_failure_touches_nothing(tmp_path: Path) -> None:
    """If packing fails (a corrupt rotated file), every input file is left in place."""
    recipe = next(e for e in all_examples() if e.id == "qpack-recipe")
    setup = ("kestrel-docs-journal kestrel-data/jobs add:d\n"
             "printf '\\143' > kestrel-data/jobs.1767225600000\n")
    assert run_script(setup, tmp_path, 30).returncode == 0
    done = run_script(recipe.body, tmp_path, 60)
    assert done.returncode != 0
    assert "Exception reading journal file: kestrel-data/jobs.1767225600000" in done.stderr
    assert sorted(p.name for p in (tmp_path / "kestrel-data").iterdir()) == [
        "jobs", "jobs.1767225600000"]


def test_qpack_recipe_waits_for_unfinished_packs(tmp_path: Path) -> None:
    """A pack file left by a crash makes the recipe do nothing, with a failing status."""
    recipe = next(e for e in all_examples() if e.id == "qpack-recipe")
    setup = ("kestrel-docs-journal kestrel-data/jobs add:d\n"
             "kestrel-docs-journal kestrel-data/jobs.1767225600000 add:a\n"
             "kestrel-docs-journal kestrel-data/jobs.1767225600000.pack add:a\n")
    assert run_script(setup, tmp_path, 30).returncode == 0
    done = run_script(recipe.body, tmp_path, 60)
    assert done.returncode != 0
    assert sorted(p.name for p in (tmp_path / "kestrel-data").iterdir()) == [
        "jobs", "jobs.1767225600000", "jobs.1767225600000.pack"]
