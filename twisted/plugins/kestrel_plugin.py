"""
The twistd plugin C{kestrel}: the real work is in L{kestrel.tap}.

The old C{pykestrel} client also installs a top-level package named
C{kestrel}. Where it shadows or overwrites txkestrel's, the server would die
with a C{ModuleNotFoundError}; instead, C{twistd kestrel} and C{twist kestrel}
stop at once with a one-line error naming the clash (L{package_clash}).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from twisted.application.service import ServiceMaker

#: What to do about a clash, in the error line (docs/clients.md explains it).
_FIX = ("install txkestrel and pykestrel in separate environments "
        "(virtualenvs), see docs/clients.md")


def _location(spec: Any) -> str:
    """Where the package of C{spec} lives, for the error line."""
    locations = list(spec.submodule_search_locations or [])
    return locations[0] if locations else str(spec.origin)


def package_clash() -> str | None:
    """
    A one-line error when the importable C{kestrel} package is not txkestrel's
    (the old pykestrel client installs one of the same name), else None.

    It is not txkestrel's when C{kestrel} cannot be imported, has no
    C{kestrel.tap}, or holds pykestrel's C{kestrel/client.py} module (txkestrel's
    own C{kestrel.client} is a package, a folder).
    """
    try:
        spec = importlib.util.find_spec("kestrel")
    except (ImportError, ValueError) as e:
        return f"kestrel: the package 'kestrel' cannot be found ({e}); {_FIX}"
    if spec is None:
        return "kestrel: no package named 'kestrel' is installed; reinstall txkestrel"
    where = _location(spec)
    try:
        ours = importlib.util.find_spec("kestrel.tap") is not None
        theirs = any(os.path.isfile(os.path.join(folder, "client.py"))
                     for folder in spec.submodule_search_locations or [])
    except Exception as e:  # noqa: BLE001 - pykestrel's __init__ fails on Python 3
        return (f"kestrel: the package 'kestrel' at {where} is not txkestrel's (importing it "
                f"fails: {type(e).__name__}: {e}); the pykestrel client installs a package "
                f"of the same name: {_FIX}")
    if not ours or theirs:
        return (f"kestrel: the package 'kestrel' at {where} is not txkestrel's (or is mixed "
                f"with pykestrel's kestrel/client.py); the pykestrel client installs a package "
                f"of the same name: {_FIX}")
    return None


class KestrelServiceMaker(ServiceMaker):
    """
    L{ServiceMaker} for C{kestrel.tap} that first checks that C{kestrel} is
    txkestrel's package, and exits with a one-line error if it is not.
    """

    @property
    def options(self) -> Any:
        """C{kestrel.tap.Options}, once the package is known to be ours."""
        self._check()
        return super().options

    @property
    def makeService(self) -> Any:  # noqa: N802 - Twisted's name
        """C{kestrel.tap.makeService}, once the package is known to be ours."""
        self._check()
        return super().makeService

    @staticmethod
    def _check() -> None:
        problem = package_clash()
        if problem is not None:
            raise SystemExit(problem)


kestrel = KestrelServiceMaker("txkestrel", "kestrel.tap",
                              "Kestrel-compatible message queue server", "kestrel")
