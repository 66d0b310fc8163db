"""
The Apache Thrift library against a real server, with code generated at
test time by Debian's thrift compiler (package thrift-compiler).
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.clients.matrix import operation_params, run_operation
from tests.clients.thrift_adapter import ThriftAdapter
from tests.wire.conftest import ROOT, KestrelProcess

IDL = ROOT / "thrift" / "kestrel.thrift"
#: Socket timeout (ms): longer than every get's timeout_msec.
TIMEOUT_MS = 10_000


class ApacheThriftAdapter(ThriftAdapter):
    """Apache Thrift: generated C{Kestrel.Client}, C{TFramedTransport}, C{TBinaryProtocol}."""

    name = "Apache `thrift` (code from `thrift --gen py`)"

    def __init__(self, servers: list[KestrelProcess], service: Any) -> None:
        from thrift.protocol import TBinaryProtocol
        from thrift.transport import TSocket, TTransport

        sock = TSocket.TSocket(servers[0].host, servers[0].ports["thrift"])
        sock.setTimeout(TIMEOUT_MS)
        self.transport = TTransport.TFramedTransport(sock)
        self.transport.open()
        super().__init__(servers, service.Client(TBinaryProtocol.TBinaryProtocol(self.transport)))

    def shutdown(self) -> None:
        self.transport.close()


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The C{Kestrel} service module that C{thrift --gen py} generates from the IDL."""
    compiler = shutil.which("thrift")
    if compiler is None:
        pytest.skip("the thrift compiler (Debian package thrift-compiler) is not installed")
    out = tmp_path_factory.mktemp("apache")
    idl = out / "kestrel_matrix.thrift"  # the generated package is named after the file
    shutil.copyfile(IDL, idl)
    subprocess.run([compiler, "--gen", "py", "-out", str(out), str(idl)], check=True)
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module("kestrel_matrix.Kestrel")
    finally:
        sys.path.remove(str(out))


@pytest.fixture(scope="module")
def client(server: KestrelProcess, generated: Any) -> Iterator[ApacheThriftAdapter]:
    adapter = ApacheThriftAdapter([server], generated)
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(ApacheThriftAdapter))
def test_apache_thrift(client: ApacheThriftAdapter, op: str) -> None:
    """Each matrix operation through Apache Thrift, checked on the server's counters."""
    run_operation(client, op, "apache")
