"""Fakes of the outside world's endpoints, at the wire, for the tests and the benchmarks.

Each one is a real server on a local port speaking the real protocol: APNs over TLS and HTTP/2
(`fake_apns`), FCM HTTP v1 and Google's OAuth token endpoint (`fake_fcm`), an xmtpd node over gRPC
(`fake_xmtpd`), a Web Push service that verifies VAPID and decrypts (`fake_webpush`), and a webhook
receiver that verifies Standard Webhooks signatures (`webhook_receiver`); `keys` makes the credentials
they expect. A development package beside tests/ and bench/, which both drive the same fakes: not in the
wheel nor the image, and nothing in app/ or workers/ imports it (an import contract in pyproject.toml).
"""
