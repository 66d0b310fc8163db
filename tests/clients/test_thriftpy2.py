"""thriftpy2 (framed transport, binary protocol) against a real server, operation by operation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import thriftpy2
from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.transport import TFramedTransportFactory

from tests.clients.matrix import operation_params, run_operation
from tests.clients.thrift_adapter import ThriftAdapter
from tests.wire.conftest import ROOT, KestrelProcess

IDL = ROOT / "thrift" / "kestrel.thrift"
#: Socket timeout (ms): longer than every get's timeout_msec.
TIMEOUT_MS = 10_000


class Thriftpy2Adapter(ThriftAdapter):
    """thriftpy2's client of the IDL, loaded at run time."""

    name = "thriftpy2"

    def __init__(self, servers: list[KestrelProcess], idl: Path = IDL) -> None:
        service = thriftpy2.load(str(idl), module_name="kestrel_matrix_thrift").Kestrel
        client = make_client(service, servers[0].host, servers[0].ports["thrift"],
                             trans_factory=TFramedTransportFactory(),
                             proto_factory=TBinaryProtocolFactory(), timeout=TIMEOUT_MS)
        super().__init__(servers, client)

    def shutdown(self) -> None:
        self.client.close()


@pytest.fixture(scope="module")
def client(server: KestrelProcess) -> Iterator[Thriftpy2Adapter]:
    adapter = Thriftpy2Adapter([server])
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(Thriftpy2Adapter))
def test_thriftpy2(client: Thriftpy2Adapter, op: str) -> None:
    """Each matrix operation through thriftpy2, checked on the server's counters."""
    run_operation(client, op, "tp2")
