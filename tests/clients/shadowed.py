"""
python-memcached's module, whatever shadows it.

python-memcached installs a top-level module C{memcache.py}; PyPI's
C{memcache} (a meta-protocol client, in the C{test} extra too) installs a
package of the same name, which wins the import when both sit in one
environment. Tests that mean python-memcached import L{python_memcached}
from here: it is loaded from the file the python-memcached distribution
installed, under a name of its own.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from types import ModuleType

_NAME = "python_memcached_module"


def _load() -> ModuleType:
    """python-memcached's C{memcache.py}, loaded from its distribution's files."""
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    path = importlib.metadata.distribution("python-memcached").locate_file("memcache.py")
    spec = importlib.util.spec_from_file_location(_NAME, str(path))
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    spec.loader.exec_module(module)
    return module


#: python-memcached's module (its C{Client}, ...).
python_memcached = _load()
