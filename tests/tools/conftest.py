"""The load-test tests run against the wire tests' real server process."""

from tests.wire.conftest import kestrel, kestrel_factory

__all__ = ["kestrel", "kestrel_factory"]
