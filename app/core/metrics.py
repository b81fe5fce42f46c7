"""Prometheus metrics, by the names operators rely on. Labels never carry ids, tokens, URLs or topics."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

RPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

recipients_total = Counter(
    "xmtp_push_recipients", "Recipient lifecycle events", ["action"]
)  # registered | unregistered | expired | dead
subscriptions_total = Counter("xmtp_push_subscriptions", "Subscription changes", ["action"])  # added | removed
rpc_seconds = Histogram(
    "xmtp_push_rpc_seconds", "Notification API call latency", ["method", "code"], buckets=RPC_BUCKETS
)
