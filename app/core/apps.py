"""A provider app's name: which configuration it comes from, and its name there.

The flat settings (`XMTP_PUSH_APNS_*`, `XMTP_PUSH_FCM_*`, ...) make one app per channel, `default`,
which XMTP and Marmot pushes go through; the Matrix gateway makes one per key of its config's
`apps:`. Two sources may use one name, so the source is part of the name, as a field: the provider
registry keys on both, and a metric label shows a gateway app as `matrix:<app id>`.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class AppSource(enum.StrEnum):
    SETTINGS = "settings"  # the flat settings' apps
    MATRIX = "matrix"  # the gateway config's apps


class AppName(NamedTuple):
    source: AppSource
    name: str

    @property
    def label(self) -> str:
        """As metrics and logs show it: a settings app by its name, another one prefixed by its source."""
        return self.name if self.source is AppSource.SETTINGS else f"{self.source}:{self.name}"


DEFAULT_APP = AppName(AppSource.SETTINGS, "default")
