"""The admin tests use the wire tests' real server process fixtures."""

from tests.wire.conftest import kestrel, kestrel_factory

__all__ = ["kestrel", "kestrel_factory"]
