"""The delivery channels, by the one name each has everywhere: settings, the provider registry,
queue streams (`deliveries.<channel>`), metric labels and logs. A StrEnum, so each member is its
name as a string on the wire and in metrics, and a misspelt channel fails where it is written."""

from __future__ import annotations

import enum


class Channel(enum.StrEnum):
    APNS = "apns"
    FCM = "fcm"
    HTTP = "http"  # signed HTTPS webhooks
    WEBPUSH = "webpush"
