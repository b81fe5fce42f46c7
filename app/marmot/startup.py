"""What the Marmot server refuses at start, beyond a key it cannot parse: a key file its group or
others may read, and relays reached without TLS unless the operator allows them. Each problem is one
line naming the setting, never its value."""

from __future__ import annotations

import os
import stat
from urllib.parse import urlsplit

from app.core.config import Settings
from app.marmot.keys import key_file_path

KEY_SETTING = "XMTP_PUSH_MARMOT_SECRET_KEY"
RELAYS_SETTING = "XMTP_PUSH_MARMOT_RELAYS"
ALLOW_UNENCRYPTED_SETTING = "XMTP_PUSH_MARMOT_ALLOW_UNENCRYPTED_RELAYS"
# A key file must be for its owner's eyes alone (Transponder 0.2.0 refuses the same).
READABLE_BY_OTHERS = stat.S_IRGRP | stat.S_IROTH


def key_file_problem(key_setting: str) -> str | None:
    """Why the key file `key_setting` names may not be used (its group or others may read it), or
    None: a key given inline, or a file for its owner alone."""
    path = key_file_path(key_setting)
    if path is None:
        return None
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:  # ServerKey.parse read it a moment ago; it says what is wrong when it cannot
        return None
    if not mode & READABLE_BY_OTHERS:
        return None
    return (
        f"{KEY_SETTING}: the key file may be read by its group or by others (mode {mode:04o}); "
        "make it readable by its owner alone (chmod 600)"
    )


def unencrypted_relays_problem(settings: Settings) -> str | None:
    """Why the relays may not be used (some are ws://, and they are not allowed), or None."""
    unencrypted = sum(1 for url in settings.marmot_relays if urlsplit(url).scheme == "ws")
    if not unencrypted or settings.marmot_allow_unencrypted_relays:
        return None
    return (
        f"{RELAYS_SETTING}: {unencrypted} of {len(settings.marmot_relays)} relay(s) are ws:// (no TLS: "
        f"anyone on the way reads and alters the traffic); use wss://, or set "
        f"{ALLOW_UNENCRYPTED_SETTING}=true for relays on this host or a network you trust"
    )


def start_problems(settings: Settings) -> list[str]:
    """Everything about the configured Marmot server that keeps it from starting."""
    problems = [unencrypted_relays_problem(settings)]
    if settings.marmot_secret_key is not None:
        problems.append(key_file_problem(settings.marmot_secret_key.get_secret_value()))
    return [problem for problem in problems if problem is not None]
