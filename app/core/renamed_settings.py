"""Settings under a new name: the old one is still read as the new one (a variable, a key of the
XMTP_PUSH_CONFIG file, a keyword value alike), and each old name in use is warned about once at
start-up, never with its value. Both names of one setting given different values are refused, naming
both: which of the two was meant cannot be told."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

# Old name -> new name, as Settings' fields (a variable is the prefix and the name in upper case).
# The webhook channel's were XMTP_PUSH_HTTP_*, the word the HTTP API's listener keeps.
RENAMED_SETTINGS = {
    "http_enabled": "webhook_enabled",
    "http_allowed_domains": "webhook_allowed_domains",
    "http_allow_private_addresses": "webhook_allow_private_addresses",
    "http_allow_insecure": "webhook_allow_insecure",
    "http_timeout_seconds": "provider_timeout_seconds",  # every provider's request bound, not webhooks' alone
    "http_max_per_host": "webhook_max_per_host",
    "http_max_per_fast_host": "webhook_max_per_fast_host",
}


class RenamedSettingConflict(Exception):
    """A setting's old and new names both given, with different values; the message names both."""


class OldNamesRead(PydanticBaseSettingsSource):
    """One source of settings, with each old name's value read as its new name's. `named` says how a
    setting is called in this source, for messages; `old_values` adds values the source itself does
    not read (the environment's source reads the fields' variables only)."""

    def __init__(
        self,
        source: PydanticBaseSettingsSource,
        named: Callable[[str], str],
        old_values: Callable[[], Mapping[str, Any]] = dict,
    ) -> None:
        super().__init__(source.settings_cls)
        self._source, self._named, self._old_values = source, named, old_values

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, "", False  # never asked: __call__ reads the wrapped source whole

    def __call__(self) -> dict[str, Any]:
        values = {**self._source(), **self._old_values()}
        for key in [key for key in values if key.lower() in RENAMED_SETTINGS]:
            old, value = key.lower(), values.pop(key)
            new = RENAMED_SETTINGS[old]
            if new in values and not _same(self.settings_cls, new, values[new], value):
                raise RenamedSettingConflict(
                    f"{self._named(old)} and {self._named(new)} are the old and the new name of one "
                    f"setting, given different values: keep {self._named(new)} alone"
                )
            values.setdefault(new, value)
        return values


def _same(settings_cls: type[BaseSettings], name: str, one: Any, other: Any) -> bool:
    """The two values mean the same once read as the field reads them ("true" and "1" do); bad ones
    are compared as given. (Not through the model: its validation reads every source again.)"""
    field = settings_cls.model_fields[name]
    # The field's type with its constraints and validators, built at run time.
    kind: Any = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
    reader: TypeAdapter[Any] = TypeAdapter(kind)
    try:
        return bool(reader.validate_python(one) == reader.validate_python(other))
    except ValidationError:
        return bool(one == other)


def old_variables(prefix: str, environment: Mapping[str, str]) -> dict[str, str]:
    """The old names' values in `environment`, by old name (variables' names are case-blind)."""
    values = {name.upper(): value for name, value in environment.items()}
    return {
        old: values[variable] for old in RENAMED_SETTINGS if (variable := f"{prefix}{old}".upper()) in values
    }


def renamed_setting_warnings(
    prefix: str, variables: Collection[str], file_keys: Collection[str]
) -> list[str]:
    """One line for each old name in use, as a variable (`variables` in upper case) or as a key of
    the file (`file_keys` in lower case)."""
    lines = []
    for old, new in RENAMED_SETTINGS.items():
        if f"{prefix}{old}".upper() in variables:
            lines.append(
                f"{prefix}{old.upper()} is deprecated: rename it {prefix}{new.upper()} (read as that for now)"
            )
        if old in file_keys:
            lines.append(
                f"{old} (in the {prefix}CONFIG file) is deprecated: rename it {new} (read as that for now)"
            )
    return lines
