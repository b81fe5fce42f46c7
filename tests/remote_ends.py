"""Module-scoped fixtures for the APNs and FCM fakes (app/testing), shared by the end-to-end tests:
import them into a test module to use them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.testing.fake_apns import FakeApns, TlsFiles, make_tls_files
from app.testing.fake_fcm import FakeFcm


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("apns-tls"))


@pytest.fixture(scope="module")
def apns_server(tls: TlsFiles) -> Iterator[FakeApns]:
    with FakeApns(tls) as fake:
        yield fake


@pytest.fixture(scope="module")
def fcm_server() -> Iterator[FakeFcm]:
    with FakeFcm() as fake:
        yield fake
