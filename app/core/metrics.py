"""Prometheus metrics, by the names operators rely on. Labels never carry ids, tokens, URLs or topics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# action: registered | unregistered | expired | dead
recipients_total = Counter("xmtp_push_recipients", "Recipient lifecycle events", ["action"])
# action: added | removed
subscriptions_total = Counter("xmtp_push_subscriptions", "Subscription changes", ["action"])
rpc_seconds = Histogram(
    "xmtp_push_rpc_seconds", "Notification API call latency", ["method", "code"], buckets=RPC_BUCKETS
)

DELIVERY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# result: ingested | ineligible | fanned_out
envelopes_total = Counter("xmtp_push_envelopes", "Envelopes by result", ["result"])
# outcome: delivered | failed | rejected | mismatch | dead | suppressed
deliveries_total = Counter("xmtp_push_deliveries", "Delivery outcomes", ["channel", "outcome"])
delivery_seconds = Histogram(
    "xmtp_push_delivery_seconds", "One delivery attempt's duration", ["channel"], buckets=DELIVERY_BUCKETS
)
queue_depth = Gauge("xmtp_push_queue_depth", "Entries waiting or in flight", ["queue"])
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
