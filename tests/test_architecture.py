"""The delivery core stays source-neutral: no XMTP vocabulary in app/delivery.

The package layers themselves are checked by `lint-imports` in `make lint` ([tool.importlinter] in
pyproject.toml). This checks the words: a provider that mentions topics, sequence ids, recipients
or hints has started to know where its pushes come from. APNs's own header `apns-topic` (the
app's bundle id), Apple's reasons `DeviceTokenNotForTopic` and `TopicDisallowed` and Web Push's
replacement header (named `Topic` by RFC 8030) are the channels' vocabulary.
"""

from __future__ import annotations

import re
from pathlib import Path

DELIVERY_CORE = Path(__file__).resolve().parents[1] / "app" / "delivery"
SOURCE_WORDS = re.compile(r"topic|sequence|recipient|hint", re.IGNORECASE)
CHANNEL_WORDS = re.compile(
    r'apns[-_ ]topic|DeviceTokenNotForTopic|TopicDisallowed|COLLAPSE_HEADER = "topic"', re.IGNORECASE
)


def source_words(text: str) -> list[str]:
    return SOURCE_WORDS.findall(CHANNEL_WORDS.sub("", text))


def test_the_check_finds_source_words_and_spares_the_channels_own() -> None:
    assert source_words("def send(self, hint: Hint, target: Target)") == ["hint", "Hint"]
    assert source_words('body["sequence_id"], recipient_id, collapse_id=topic') == [
        "sequence",
        "recipient",
        "topic",
    ]
    assert source_words('headers["apns-topic"]; push.apns_topic; "DeviceTokenNotForTopic"') == []
    assert source_words('COLLAPSE_HEADER = "topic"') == []


def test_no_module_of_the_delivery_core_mentions_topics_sequence_ids_recipients_or_hints() -> None:
    modules = sorted(DELIVERY_CORE.rglob("*.py"))
    assert len(modules) >= 10  # the core and its providers were found
    found = {
        str(m.relative_to(DELIVERY_CORE)): words for m in modules if (words := source_words(m.read_text()))
    }
    assert found == {}
