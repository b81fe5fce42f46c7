"""xmtp-push: push notification backend for XMTP."""

__version__ = "0.1.0"
