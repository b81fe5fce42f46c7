"""The commands `config check --role` checks for, and what each cannot run without.

The XMTP ones use the database; the Matrix gateway and the Marmot server do not, so their check
opens no database (and creates no SQLite file).
"""

from __future__ import annotations

XMTP_ROLES = ("dev", "api", "worker", "listen")
# The XMTP roles that use the channels (the listener only reads the network).
SENDING_ROLES = ("dev", "api", "worker")
ROLES = (*XMTP_ROLES, "gateway", "marmot")
# The settings (Settings' field names) without which `xmtp-push ROLE` refuses to start.
REQUIRED = {
    "worker": ("redis_url",),
    "listen": ("xmtpd_address", "redis_url"),
    "gateway": ("matrix_apps",),
    "marmot": ("marmot_secret_key",),
}
