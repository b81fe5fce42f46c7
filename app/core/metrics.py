"""Prometheus metrics, by the names operators rely on. Labels never carry ids, tokens, URLs or topics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from app import __version__

RPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# action: registered | unregistered | expired | dead
recipients_total = Counter("xmtp_push_recipients", "Recipient lifecycle events", ["action"])
# action: added | removed
subscriptions_total = Counter("xmtp_push_subscriptions", "Subscription changes", ["action"])
rpc_seconds = Histogram(
    "xmtp_push_rpc_seconds", "Notification API call latency", ["method", "code"], buckets=RPC_BUCKETS
)

# The gRPC server, by the names of Prometheus' gRPC middlewares (app/api/grpc_metrics.py). grpc_service
# and grpc_method are those served (never a name only a caller sent); grpc_type: unary | client_stream |
# server_stream | bidi_stream; grpc_code: Go's name of the status code (OK, InvalidArgument, ...).
GRPC_LABELS = ("grpc_service", "grpc_method", "grpc_type")
grpc_server_started_total = Counter("grpc_server_started", "RPCs started on the server", GRPC_LABELS)
grpc_server_handled_total = Counter(
    "grpc_server_handled", "RPCs completed on the server, by code", [*GRPC_LABELS, "grpc_code"]
)
grpc_server_handling_seconds = Histogram(
    "grpc_server_handling_seconds",
    "Time from an RPC's start to its end on the server",
    GRPC_LABELS,
    buckets=RPC_BUCKETS,
)

# Calls of NotificationService refused by caller authentication, by reason (app/auth/rejections.py:
# missing | malformed | unsupported_alg | untrusted | expired | not_yet_valid | audience | issuer | scope).
auth_rejections_total = Counter(
    "xmtp_push_auth_rejections", "Calls refused by caller authentication", ["reason"]
)
# quota: calls | topic_changes | new_recipients (docs/callers.md#quotas-per-caller); never the caller.
throttled_total = Counter("xmtp_push_throttled", "Calls refused by a quota", ["quota"])

DELIVERY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# result: ingested | ineligible | fanned_out
envelopes_total = Counter("xmtp_push_envelopes", "Envelopes by result", ["result"])
# outcome: delivered | failed | rejected | mismatch | dead | suppressed
deliveries_total = Counter("xmtp_push_deliveries", "Delivery outcomes", ["channel", "outcome"])
delivery_seconds = Histogram(
    "xmtp_push_delivery_seconds", "One delivery attempt's duration", ["channel"], buckets=DELIVERY_BUCKETS
)
# Absent while the queue cannot be read: an unknown depth must not look like an empty queue.
queue_depth = Gauge("xmtp_push_queue_depth", "Entries waiting or in flight", ["queue"])
queue_resets_total = Counter(
    "xmtp_push_queue_resets", "Times Redis was found to have restarted without the queue's data"
)
# dependency: database | redis (read at each scrape) | xmtpd (the listener's stream) | relay (marmot)
dependency_up = Gauge(
    "xmtp_push_dependency_up", "Whether a service this process uses answers", ["dependency"]
)
inflight = Gauge("xmtp_push_inflight", "Delivery attempts in flight", ["channel"])

# kind: group_message | welcome | identity_update | key_package | payer_report | ... | malformed
listener_envelopes_total = Counter(
    "xmtp_push_listener_envelopes", "Envelopes seen on the network, by topic kind", ["kind"]
)
# reason: duplicate | not_pushable | stale | malformed
listener_dropped_total = Counter("xmtp_push_listener_dropped", "Envelopes not queued", ["reason"])
listener_reconnects_total = Counter("xmtp_push_listener_reconnects", "Firehose streams reopened")
listener_catchup_total = Counter("xmtp_push_listener_catchup_envelopes", "Envelopes read by catch-up queries")
listener_lag_seconds = Gauge(
    "xmtp_push_listener_lag_seconds", "Now minus originator_ns of the newest envelope"
)
listener_lag_envelopes = Gauge(
    "xmtp_push_listener_lag_envelopes",
    "Envelopes the node has shown (its newest per originator) that are not queued yet",
)
# 0: not connected (connecting or backing off), 1: catching up, 2: live on the firehose, 3: stopped
# cleanly (set as the process ends)
listener_state = Gauge("xmtp_push_listener_state", "0 connecting, 1 catching up, 2 live, 3 stopped")

# The backlog, read from the queue at scrape time by any process that sees it (dashboards take max).
queue_oldest_seconds = Gauge(
    "xmtp_push_queue_oldest_seconds", "Age of the oldest entry not yet acknowledged", ["queue"]
)
retries_waiting = Gauge("xmtp_push_retries_waiting", "Delivery retries waiting for their time")

# Attempts that end in a retry (a transient failure), and pushes put back without an attempt.
retries_total = Counter("xmtp_push_retries", "Attempts that failed and were queued again", ["channel"])
deferred_total = Counter(
    "xmtp_push_deferred",
    "Pushes put back without an attempt (busy or parked host, paused channel)",
    ["channel"],
)
webhook_parked_hosts = Gauge("xmtp_push_webhook_parked_hosts", "Webhook hosts parked by their breaker")

# Providers: connections and credentials, per channel and app (apps are operator-configured names).
provider_connections = Gauge(
    "xmtp_push_provider_connections", "Connections open to the provider", ["channel", "app"]
)
# Connections carrying a request, or being opened for one, now.
provider_connections_in_use = Gauge(
    "xmtp_push_provider_connections_in_use",
    "Connections to the provider carrying a request",
    ["channel", "app"],
)
provider_connects_total = Counter(
    "xmtp_push_provider_connects", "Connections opened to the provider", ["channel", "app"]
)
credentials_ok = Gauge(
    "xmtp_push_credentials_ok",
    "1 while the provider accepts the credentials (or has not judged them yet), 0 after a refusal",
    ["channel", "app"],
)
credentials_refused_total = Counter(
    "xmtp_push_credentials_refused", "Answers refusing the credentials", ["channel", "app"]
)
apns_token_age_seconds = Gauge(
    "xmtp_push_apns_token_age_seconds", "Age of the APNs provider token (JWT) in use", ["app"]
)
# result: ok | failed
fcm_token_refreshes_total = Counter(
    "xmtp_push_fcm_token_refreshes", "FCM OAuth access-token fetches", ["app", "result"]
)

build_info = Gauge("xmtp_push_build_info", "The running version (always 1)", ["version"])
build_info.labels(__version__).set(1)

# Marmot notification server. result: accepted | duplicate | backlog | invalid | rate_limited
marmot_triggers_total = Counter("xmtp_push_marmot_triggers", "Gift-wrapped triggers by result", ["result"])
# platform: apns | fcm | unknown (a chunk refused before decryption);
# outcome: delivered | failed | dead | invalid | rate_limited
marmot_tokens_total = Counter(
    "xmtp_push_marmot_tokens", "Encrypted token chunks by platform and outcome", ["platform", "outcome"]
)
marmot_relays_connected = Gauge("xmtp_push_marmot_relays_connected", "Relays with an open connection")
marmot_pending = Gauge("xmtp_push_marmot_pending", "Live triggers waiting for a handler")

# The Matrix push gateway. code: the HTTP status answered; app: the configured app id (operator
# config; "none" when no app serves a device's app id); outcome: delivered | rejected | failed |
# duplicate | limited.
matrix_notifications_total = Counter("xmtp_push_matrix_notifications", "Notify requests by answer", ["code"])
matrix_devices_total = Counter("xmtp_push_matrix_devices", "Notified devices by outcome", ["app", "outcome"])
matrix_notify_seconds = Histogram(
    "xmtp_push_matrix_notify_seconds", "Time to answer a notify request", buckets=DELIVERY_BUCKETS
)

# The legacy notifications.v1 API (app.legacy) and its node-go listener.
legacy_installations_total = Counter(
    "xmtp_push_legacy_installations", "Legacy installation lifecycle events", ["action"]
)
legacy_subscriptions_total = Counter(
    "xmtp_push_legacy_subscriptions", "Legacy subscription changes", ["action"]
)
legacy_deliveries_total = Counter(
    "xmtp_push_legacy_deliveries", "Legacy delivery outcomes", ["channel", "outcome"]
)
node_go_envelopes_total = Counter("xmtp_push_node_go_envelopes", "Envelopes read from node-go", ["kind"])
node_go_listener_state = Gauge("xmtp_push_node_go_listener_state", "0 connecting, 2 live, 3 stopped")
node_go_reconnects_total = Counter("xmtp_push_node_go_reconnects", "node-go SubscribeAll streams reopened")
