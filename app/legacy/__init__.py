"""The legacy notifications.v1 API of XMTP apps shipping today: a source of its own."""
