"""A gRPC port already taken stops start-up, as an HTTP port clash does: two servers on one port would
otherwise share it (grpcio's SO_REUSEPORT) and split the calls between two databases."""

from __future__ import annotations

import pytest

from app.api.grpc_server import PortUnavailable, start_grpc_server
from app.runtime import open_runtime
from tests.support import make_settings


async def test_a_second_server_on_a_taken_grpc_port_does_not_start(sqlite_url: str) -> None:
    async with open_runtime(make_settings(sqlite_url), sends=False) as runtime:
        first, port = await start_grpc_server(runtime, "127.0.0.1", 0)
        try:
            with pytest.raises(PortUnavailable, match=f"gRPC address 127.0.0.1:{port} is in use"):
                second, _ = await start_grpc_server(runtime, "127.0.0.1", port)
                await second.stop(None)  # reached only if it bound: the test then fails above
        finally:
            await first.stop(None)
