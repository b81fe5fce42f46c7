"""The HTTP application: Connect routes for NotificationService, health and metrics."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from app import __version__
from app.api import connect, health, ingest, status
from app.runtime import Runtime

DOCS_STATIC = "/docs/static"
DESCRIPTION = (
    "Push backend for XMTP. SDKs register recipients and their topic subscriptions through "
    "`xmtp.backend.v1.NotificationService`, over gRPC on the gRPC port or over the Connect "
    "protocol on the routes below."
)


def create_app(runtime: Runtime | None = None) -> FastAPI:
    """Build the app around a started runtime (None only to render the OpenAPI document)."""
    # /docs is Swagger UI with its script, style and icon served from the fastapi-offline package
    # under /docs/static: it works on a host that reaches no CDN. Swagger UI's validator badge (an
    # image from its public validator site) is off for the same reason.
    app = FastAPIOffline(
        title="xmtp-push",
        version=__version__,
        description=DESCRIPTION,
        redoc_url=None,
        static_url=DOCS_STATIC,
        swagger_ui_parameters={"validatorUrl": None},
    )
    app.state.runtime = runtime
    if runtime is not None:
        app.state.probes = runtime.probes("database", "redis")
    app.include_router(connect.router)
    app.include_router(ingest.router)
    app.include_router(health.router)
    app.include_router(status.router)
    return app
