"""The wheel carries every package of kestrel/: setup.cfg lists them explicitly."""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_setup_cfg_lists_every_package() -> None:
    """Each folder of kestrel/ with an __init__.py is in [options] packages, and nothing else."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    listed = set(parser["options"]["packages"].split())
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "kestrel").rglob("__init__.py")}
    assert listed - {"twisted.plugins"} == found
    assert {"kestrel.config", "kestrel.tools.load"} <= found
