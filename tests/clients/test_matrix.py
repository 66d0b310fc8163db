"""
The matrix as a whole: docs/clients.md shows exactly the tested table, and
the server refuses to start, with one line naming the clash, when the old
pykestrel client's `kestrel` package shadows txkestrel's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clients.matrix import OPERATIONS, Adapter, check_marker, render_table
from tests.clients.test_aiomcache import AiomcacheAdapter
from tests.clients.test_apache_thrift import ApacheThriftAdapter
from tests.clients.test_bmemcached import BmemcachedAdapter
from tests.clients.test_cache_memcached_perl import CacheMemcachedPerlAdapter
from tests.clients.test_dalli import DalliAdapter
from tests.clients.test_emcache import EmcacheAdapter
from tests.clients.test_gomemcache import GomemcacheAdapter
from tests.clients.test_libmemcached_tools import LibmemcachedToolsAdapter
from tests.clients.test_memcache_pypi import MemcachePypiAdapter
from tests.clients.test_memjs import MemjsAdapter
from tests.clients.test_meta_memcache import MetaMemcacheAdapter
from tests.clients.test_node_memcached import NodeMemcachedAdapter
from tests.clients.test_php_memcached import PhpMemcachedAdapter, PhpMemcachedBinaryAdapter
from tests.clients.test_pylibmc import PylibmcAdapter
from tests.clients.test_pylibmc_binary import PylibmcBinaryAdapter
from tests.clients.test_pymemcache import HashClientAdapter, PymemcacheAdapter
from tests.clients.test_python_memcached import PythonMemcachedAdapter
from tests.clients.test_spymemcached import SpymemcachedAdapter, SpymemcachedBinaryAdapter
from tests.clients.test_thriftpy2 import Thriftpy2Adapter
from tests.wire.conftest import ROOT

#: The matrix's rows, in the order of docs/clients.md.
ADAPTERS: list[type[Adapter]] = [
    PythonMemcachedAdapter, PymemcacheAdapter, HashClientAdapter, AiomcacheAdapter,
    EmcacheAdapter, PylibmcAdapter, PylibmcBinaryAdapter, MetaMemcacheAdapter, MemcachePypiAdapter,
    BmemcachedAdapter, LibmemcachedToolsAdapter, CacheMemcachedPerlAdapter, PhpMemcachedAdapter,
    PhpMemcachedBinaryAdapter, GomemcacheAdapter, SpymemcachedAdapter, SpymemcachedBinaryAdapter,
    DalliAdapter, NodeMemcachedAdapter, MemjsAdapter, ApacheThriftAdapter, Thriftpy2Adapter,
]


def test_docs_show_the_tested_matrix() -> None:
    """docs/clients.md holds the table rendered from the adapters, and every reason."""
    docs = (ROOT / "docs" / "clients.md").read_text()
    assert render_table(ADAPTERS) in docs
    for adapter in ADAPTERS:
        for op, reason in adapter.unsupported.items():
            assert f"{adapter.name}, {OPERATIONS[op]}: {reason}" in " ".join(docs.split()), (
                adapter.name, op)


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.__name__)
def test_markers_agree_with_adapters(adapter: type[Adapter]) -> None:
    """Every operation is either expressed by the adapter or marked unsupported with a reason."""
    for op in OPERATIONS:
        check_marker(adapter, op)


def fake_pykestrel(folder: Path) -> Path:
    """A folder holding what the pykestrel client installs: a `kestrel` package of its own."""
    package = folder / "kestrel"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""Kestrel Client"""\n\nfrom client import Client\n')
    (package / "client.py").write_text("class Client:\n    pass\n")
    return folder


@pytest.mark.parametrize("launcher", ["twist", "twistd"])
def test_pykestrel_clash_is_one_line(tmp_path: Path, launcher: str) -> None:
    """With pykestrel's `kestrel` first on the path, the server stops with one line naming it."""
    shadow = fake_pykestrel(tmp_path / "site")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow), str(ROOT)]))
    if launcher == "twist":
        command = [sys.executable, "-m", "twisted", "kestrel", "--memcache-port", "0"]
    else:
        command = [sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
                   "-n", "kestrel", "--memcache-port", "0"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, timeout=60,
                          check=False)
    assert done.returncode == 1
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "pykestrel" in lines[0] and "separate environments" in lines[0]
    assert str(shadow / "kestrel") in lines[0]
    assert "Traceback" not in done.stderr.decode() + done.stdout.decode()


def test_pykestrel_files_mixed_into_ours_are_refused(tmp_path: Path) -> None:
    """pykestrel's kestrel/client.py beside txkestrel's modules is refused as well."""
    import shutil

    mixed = tmp_path / "site"
    shutil.copytree(ROOT / "kestrel", mixed / "kestrel")
    (mixed / "kestrel" / "client.py").write_text("class Client:\n    pass\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(mixed), str(ROOT)]))
    done = subprocess.run([sys.executable, "-m", "twisted", "kestrel", "--help"], cwd=tmp_path,
                          env=env, capture_output=True, timeout=60, check=False)
    assert done.returncode == 1
    [line] = done.stderr.decode().strip().splitlines()
    assert "pykestrel" in line and str(mixed / "kestrel") in line
