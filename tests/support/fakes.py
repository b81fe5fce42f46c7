"""The fixtures that start a fake remote end (fakes), one per fake, for every test module:
tests/conftest.py registers this module as a plugin (`pytest_plugins`), so a test names the fixture and
imports nothing.

The APNs and FCM fakes, and the TLS files they serve with, are module-scoped: a test that needs a fake
of its own state resets it (`reset()`). The webhook receiver, the Web Push service and the node-go node
are started for each test. A module that needs a fake with other options (another scope, TLS where
these have none, a server that never answers) defines a fixture of its own under another name, or
overrides one of these.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from fakes.fake_apns import FakeApns
from fakes.fake_fcm import FakeFcm
from fakes.fake_node_go import FakeNodeGo
from fakes.fake_webpush import FakeWebPush
from fakes.tls import TlsFiles, make_tls_files
from fakes.webhook_receiver import Receiver


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A throw-away CA and a server certificate for 127.0.0.1 and localhost."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def apns_server(tls: TlsFiles) -> Iterator[FakeApns]:
    with FakeApns(tls) as fake:
        yield fake


@pytest.fixture(scope="module")
def fcm_server() -> Iterator[FakeFcm]:
    """FCM's send and token endpoints over plain HTTP."""
    with FakeFcm() as fake:
        yield fake


@pytest.fixture
def fakes(apns_server: FakeApns, fcm_server: FakeFcm) -> Iterator[tuple[FakeApns, FakeFcm]]:
    """Both push fakes, reset; the test fails when a request to the APNs fake did not verify."""
    apns_server.reset()
    fcm_server.reset()
    yield apns_server, fcm_server
    assert apns_server.failures == []


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    """A webhook receiver over HTTP; the test fails when a request to it did not verify."""
    async with Receiver() as started:
        yield started
        assert started.failures == [], started.failures


@pytest.fixture
async def service() -> AsyncIterator[FakeWebPush]:
    """A Web Push service over HTTP."""
    async with FakeWebPush() as fake:
        yield fake


@pytest.fixture
async def node_go() -> AsyncIterator[FakeNodeGo]:
    """An xmtp-node-go node serving SubscribeAll over plain gRPC, in the test's event loop."""
    async with FakeNodeGo() as fake:
        yield fake
