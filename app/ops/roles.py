"""The commands `config check --role` checks for, and what each cannot run without.

The XMTP ones use the database; the Matrix gateway and the Marmot server do not, so their check
opens no database (and creates no SQLite file).
"""

from __future__ import annotations

from app.core.config import ENV_PREFIX

XMTP_ROLES = ("dev", "api", "worker", "listen")
# The XMTP roles that use the channels (the listener only reads the network).
SENDING_ROLES = ("dev", "api", "worker")
ROLES = (*XMTP_ROLES, "gateway", "marmot")
# The settings (Settings' field names) without which `xmtp-push ROLE` refuses to start.
REQUIRED = {
    "worker": ("redis_url",),
    "listen": ("redis_url",),
    "gateway": ("matrix_apps",),
    "marmot": ("marmot_secret_key",),
}
# The settings of which a command needs at least one: `listen` reads xmtpd, node-go or both.
REQUIRED_ONE_OF = {"listen": ("xmtpd_address", "node_go_address")}


def needs_one_of(role: str) -> str:
    """The line that says `role` runs without any of its REQUIRED_ONE_OF settings."""
    names = " or ".join(f"{ENV_PREFIX}{name.upper()}" for name in REQUIRED_ONE_OF[role])
    return f"{names}: one of them is required by `{role}`"
