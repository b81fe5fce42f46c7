"""The JWKS refreshed in the background while the API serves (docs/callers.md#key-set): keys rotated on
a real server on loopback during the run take effect over both transports, a withdrawn key stops
verifying, and a failed fetch keeps the last set."""

from __future__ import annotations

import pytest

from tests.support import eventually, make_settings, running
from tests.support.auth import claims, jwks_server, signing_key
from tests.support.auth_calls import connect_call, grpc_call

pytestmark = pytest.mark.slow
OLD, NEW = signing_key("ES256", "old"), signing_key("EdDSA", "new")


async def test_rotated_keys_take_effect_without_a_restart(sqlite_url: str) -> None:
    with jwks_server(OLD) as server:
        settings = make_settings(
            sqlite_url, auth_enabled=True, auth_jwks_url=server.url, auth_jwks_refresh_seconds=1
        )
        async with running(settings) as api:
            old, new = [f"Bearer {OLD.sign(claims())}"], [f"Bearer {NEW.sign(claims())}"]
            assert (await grpc_call(api, old)).code == "INVALID_ARGUMENT"  # admitted
            assert (await connect_call(api, new)).message == "token signature is not trusted"
            server.status = 503  # a failed refresh keeps the last set
            fetched = server.requests
            await eventually(lambda: server.requests > fetched + 1, 5, "two failed refreshes")
            assert (await connect_call(api, old)).code == "invalid_argument"
            server.status = 200
            server.serve(NEW)

            async def rotated() -> bool:
                return (await grpc_call(api, new)).code == "INVALID_ARGUMENT"

            await eventually(rotated, 5, "the new key")
            assert (await connect_call(api, new)).code == "invalid_argument"
            assert (await grpc_call(api, old)).message == "token signature is not trusted"
            assert (await connect_call(api, old)).message == "token signature is not trusted"
