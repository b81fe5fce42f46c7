"""`/docs` works on a host that reaches no CDN: the page names no other host, and every script, style
and icon it loads comes from our own server (docs/api.md#http-endpoints)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from tests.support import Api, make_settings, running

# Anything that names a host: a scheme's `//`, or a protocol-relative `//host`.
HOST_REFERENCE = re.compile(r"(?:[a-z][a-z0-9+.-]*:)?//[^\s'\"<>/]+", re.IGNORECASE)
ASSET_REFERENCE = re.compile(r"""(?:src|href)=["']([^"']+)["']""")


@pytest.fixture
async def api(sqlite_url: str) -> AsyncIterator[Api]:
    async with running(make_settings(sqlite_url)) as started:
        yield started


async def test_docs_name_no_other_host_and_load_their_assets_from_us(api: Api) -> None:
    page = await api.http.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    assert HOST_REFERENCE.findall(html) == []
    assert '"validatorUrl": null' in html  # no badge fetched from Swagger's validator site

    assets = ASSET_REFERENCE.findall(html)
    assert sorted(assets) == [
        "/docs/static/favicon.png",
        "/docs/static/swagger-ui-bundle.js",
        "/docs/static/swagger-ui.css",
    ]
    kinds = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
    for path in assets:
        asset = await api.http.get(path)
        assert asset.status_code == 200, path
        assert asset.headers["content-type"].startswith(kinds[path[path.rindex(".") :]]), path
    bundle = await api.http.get("/docs/static/swagger-ui-bundle.js")
    assert len(bundle.content) > 500_000 and b"SwaggerUIBundle" in bundle.content

    spec = re.search(r"url: '([^']+)'", html)
    assert spec is not None and spec.group(1) == "/openapi.json"
    document = await api.http.get(spec.group(1))
    assert document.status_code == 200 and document.json()["info"]["title"] == "xmtp-push"
