"""The HTTP application: Connect routes for NotificationService, health and metrics."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from starlette.types import ASGIApp

from app import __version__
from app.api import connect, health, ingest, matrix, status
from app.api.auth_http import ConnectAuth
from app.api.read_slots import ReadSlots
from app.auth.caller_auth import CallerAuth
from app.core.probes import Probes
from app.matrix.service import Gateway
from app.quotas.quotas import Quotas
from app.runtime import Runtime

DOCS_STATIC = "/docs/static"
DESCRIPTION = (
    "Push backend for XMTP. SDKs register recipients and their topic subscriptions through "
    "`xmtp.backend.v1.NotificationService`, over gRPC on the gRPC port or over the Connect "
    "protocol on the routes below."
)


def create_app(
    runtime: Runtime | None = None,
    *,
    reads_replica: bool = False,
    read_slots: ReadSlots | None = None,
    caller_auth: CallerAuth | None = None,
    quotas: Quotas | None = None,
) -> FastAPI:
    """Build the app around a started runtime (None only to render the OpenAPI document);
    `reads_replica`: the process reads from the read replica too, so it is ready only with it;
    `read_slots`: the process's, shared with its gRPC server (a set of its own when None);
    `caller_auth`: the process's caller authentication, when on; `quotas`: its quotas, when any is on."""
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
    app.state.read_slots = read_slots or ReadSlots()
    app.state.quotas = quotas
    if runtime is not None:
        checks = ("database", "redis", "replica") if reads_replica else ("database", "redis")
        app.state.probes = runtime.probes(*checks)
        if caller_auth is not None and caller_auth.jwks is not None:  # a key set too stale: not ready
            probes = app.state.probes
            app.state.probes = Probes(
                {**probes.checks, "auth_keys": caller_auth.jwks.fresh_check}, probes.sample
            )
    if caller_auth is not None:  # before routing, so an unknown method or verb is refused as a known one
        app.add_middleware(ConnectAuth, authenticator=caller_auth.authenticator)
    app.state.gateway = runtime.matrix if runtime is not None else None
    app.include_router(connect.router)
    if runtime is None or runtime.settings.legacy_api_enabled:
        app.include_router(connect.legacy_router)
    app.include_router(ingest.router)
    app.include_router(matrix.router)
    app.include_router(health.router)
    app.include_router(status.router)
    return app


GATEWAY_DESCRIPTION = (
    "Matrix push gateway (the Push Gateway API, a drop-in for Sygnal): homeservers POST "
    "notifications to `/_matrix/push/v1/notify`, sent through APNs and FCM."
)


def create_gateway_app(gateway: Gateway) -> FastAPI:
    """`xmtp-push gateway`: the notify route with health and metrics, no database behind it."""
    app = FastAPI(title="xmtp-push gateway", version=__version__, description=GATEWAY_DESCRIPTION)
    app.state.runtime = None
    app.state.gateway = gateway
    app.state.read_slots = ReadSlots()
    app.state.probes = Probes({"providers": gateway.providers_ready})
    app.include_router(matrix.router)
    app.include_router(health.router)
    return app


def served(app: FastAPI) -> ASGIApp:
    """What the HTTP server runs: the app with the Matrix notify route answered in front of it."""
    return matrix.NotifyFastPath(app, app.state.gateway, app.state.read_slots)
