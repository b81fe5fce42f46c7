"""Unit tests of the webhook URL policy (docs/recipients.md#webhook-url-rules).

Pure and fast: the only name lookups are of `localhost` (from /etc/hosts) and
of names under the reserved `.invalid` TLD, which never resolve.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
from pathlib import Path

import pytest

from app.delivery import url_policy
from app.delivery.url_policy import (
    CheckedWebhook,
    SharedLookups,
    UrlNotAllowed,
    UrlPolicy,
    WebhookTarget,
    check_webhook_url,
    host_allowed,
    is_blocked_address,
    parse_webhook_url,
    resolve_host,
)

STRICT = UrlPolicy()
OPEN = UrlPolicy(allow_insecure=True, allow_private_addresses=True)

# Every v4 range of docs/recipients.md, with addresses at both ends of it.
BLOCKED_V4 = [
    "0.0.0.0",
    "0.255.255.255",
    "10.0.0.0",
    "10.1.2.3",
    "10.255.255.255",
    "100.64.0.0",
    "100.100.100.100",
    "100.127.255.255",
    "127.0.0.0",
    "127.0.0.1",
    "127.255.255.255",
    "169.254.0.0",
    "169.254.169.254",
    "169.254.255.255",
    "172.16.0.0",
    "172.20.1.1",
    "172.31.255.255",
    "192.168.0.0",
    "192.168.1.1",
    "192.168.255.255",
    "224.0.0.0",
    "224.0.0.251",
    "239.255.255.255",
    "255.255.255.255",
]

# The public neighbours just outside each range (only globally routable ones:
# reserved space next to a range, such as 240/4, is not asserted either way).
ALLOWED_V4 = [
    "1.0.0.0",
    "9.255.255.255",
    "11.0.0.0",
    "100.63.255.255",
    "100.128.0.0",
    "126.255.255.255",
    "128.0.0.0",
    "169.253.255.255",
    "169.255.0.0",
    "172.15.255.255",
    "172.32.0.0",
    "192.167.255.255",
    "192.169.0.0",
    "223.255.255.255",
    "8.8.8.8",
    "1.1.1.1",
    "93.184.216.34",
]

BLOCKED_V6 = [
    "::",
    "::1",
    "fc00::",
    "fc00::1",
    "fd12:3456:789a::1",
    "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    "fe80::",
    "fe80::1",
    "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    "fec0::",
    "fec0::1",
    "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    "ff00::",
    "ff02::1",
    "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
]

ALLOWED_V6 = [
    "2001:4860:4860::8888",
    "2606:4700:4700::1111",
    "2a00:1450:4001:80b::200e",
]


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def mapped(v4: str) -> str:
    return f"::ffff:{v4}"


# --- blocked ranges ------------------------------------------------------------------------------


@pytest.mark.parametrize("address", BLOCKED_V4)
def test_private_v4_addresses_are_blocked(address: str) -> None:
    assert is_blocked_address(ip(address))


@pytest.mark.parametrize("address", ALLOWED_V4)
def test_public_v4_addresses_just_outside_the_ranges_are_allowed(address: str) -> None:
    assert ip(address).is_global  # the fixture itself is a public address
    assert not is_blocked_address(ip(address))


@pytest.mark.parametrize("address", BLOCKED_V6)
def test_private_v6_addresses_are_blocked(address: str) -> None:
    assert is_blocked_address(ip(address))


@pytest.mark.parametrize("address", ALLOWED_V6)
def test_public_v6_addresses_are_allowed(address: str) -> None:
    assert not is_blocked_address(ip(address))


@pytest.mark.parametrize("address", BLOCKED_V4)
def test_ipv4_mapped_forms_of_blocked_v4_addresses_are_blocked(address: str) -> None:
    assert is_blocked_address(ip(mapped(address)))


def test_ipv4_mapped_form_in_hex_notation_is_blocked() -> None:
    # ::ffff:7f00:1 is ::ffff:127.0.0.1 written without the dotted quad.
    assert is_blocked_address(ip("::ffff:7f00:1"))
    assert is_blocked_address(ip("::ffff:a9fe:a9fe"))  # 169.254.169.254


@pytest.mark.parametrize("address", ALLOWED_V4)
def test_ipv4_mapped_forms_of_public_v4_addresses_are_allowed(address: str) -> None:
    assert not is_blocked_address(ip(mapped(address)))


# Addresses that reach a blocked IPv4 address through an IPv6 form, or that are not globally
# routable though outside the ranges above (benchmarking, reserved, documentation).
EMBEDDED_AND_NON_GLOBAL = [
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b:1::a00:1",  # local-use NAT64 prefix, 10.0.0.1
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
    "::127.0.0.1",  # IPv4-compatible
    "::a00:1",  # IPv4-compatible 10.0.0.1, in hex
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo: a client behind 192.0.2.45
    "198.18.0.1",
    "198.19.255.254",
    "240.0.0.1",
    "192.0.2.1",
    "198.51.100.7",
    "203.0.113.9",
]


@pytest.mark.parametrize("address", EMBEDDED_AND_NON_GLOBAL)
def test_embedded_ipv4_forms_and_non_global_ranges_are_blocked(address: str) -> None:
    assert is_blocked_address(ip(address))


@pytest.mark.parametrize("address", ["64:ff9b::808:808", "2002:808:808::1", "::ffff:8.8.8.8"])
def test_embedded_forms_of_a_public_ipv4_address_are_allowed(address: str) -> None:
    assert not is_blocked_address(ip(address))


@pytest.mark.parametrize(
    "url",
    [
        "https://[64:ff9b::7f00:1]/h",
        "https://[2002:7f00:1::]/h",
        "https://[::127.0.0.1]/h",
        "https://198.18.0.1/h",
    ],
)
async def test_urls_with_embedded_or_non_global_addresses_are_refused(url: str) -> None:
    with pytest.raises(UrlNotAllowed):
        await check_webhook_url(url, UrlPolicy())


async def test_this_hosts_own_addresses_are_refused_even_when_public() -> None:
    own = UrlPolicy(own_addresses=frozenset({"8.8.4.4", "2001:4860:4860::8844"}))
    for url in ("https://8.8.4.4/h", "https://[2001:4860:4860::8844]/h", "https://[::ffff:8.8.4.4]/h"):
        with pytest.raises(UrlNotAllowed):
            await check_webhook_url(url, own)
    assert (await check_webhook_url("https://8.8.8.8/h", own)).addresses == ("8.8.8.8",)


def test_the_policy_from_settings_knows_this_hosts_interface_addresses() -> None:
    from app.core.config import Settings

    policy = UrlPolicy.from_settings(Settings())
    assert "127.0.0.1" in policy.own_addresses
    assert all(ip(a) for a in policy.own_addresses)  # plain addresses, no zone


async def test_this_hosts_addresses_are_read_again_while_the_process_runs() -> None:
    """An address this host gains after start-up (a new interface, a floating IP) is refused as a
    webhook target once the addresses are read again, within a minute; the literal's cached check
    does not keep the old answer."""
    now = [0.0]
    readings = iter([frozenset({"127.0.0.1"}), frozenset({"127.0.0.1", "8.8.4.4"})])
    host = url_policy.HostAddresses(read=lambda: next(readings), clock=lambda: now[0])
    policy = UrlPolicy(host=host)
    assert (await check_webhook_url("https://8.8.4.4/h", policy)).addresses == ("8.8.4.4",)
    now[0] = 60.0
    with pytest.raises(UrlNotAllowed):
        await check_webhook_url("https://8.8.4.4/h", policy)
    assert url_policy.THIS_HOST.max_age <= 60
    from app.core.config import Settings

    assert UrlPolicy.from_settings(Settings()).host is url_policy.THIS_HOST


# --- host_allowed --------------------------------------------------------------------------------


def test_empty_allowed_domains_allow_any_host() -> None:
    assert host_allowed("anything.example.com", ())
    assert host_allowed("example.org", [])


def test_exact_domain_matches_only_that_host() -> None:
    domains = ("hooks.example.org",)
    assert host_allowed("hooks.example.org", domains)
    assert not host_allowed("example.org", domains)
    assert not host_allowed("a.hooks.example.org", domains)
    assert not host_allowed("hooks.example.org.evil.com", domains)
    assert not host_allowed("xhooks.example.org", domains)


def test_wildcard_needs_at_least_one_more_label() -> None:
    domains = ("*.example.org",)
    assert host_allowed("a.example.org", domains)
    assert host_allowed("a.b.example.org", domains)
    assert not host_allowed("example.org", domains)
    assert not host_allowed("badexample.org", domains)
    assert not host_allowed("example.org.evil.com", domains)
    assert not host_allowed("a.example.com", domains)


def test_any_of_several_domains_may_match() -> None:
    domains = ("exact.example.com", "*.example.org")
    assert host_allowed("exact.example.com", domains)
    assert host_allowed("x.example.org", domains)
    assert not host_allowed("other.example.com", domains)


def test_domain_matching_is_case_insensitive_through_parse() -> None:
    policy = UrlPolicy(allowed_domains=("*.example.org", "hooks.example.com"))
    assert parse_webhook_url("https://A.B.Example.ORG/x", policy).host == "a.b.example.org"
    assert parse_webhook_url("https://HOOKS.EXAMPLE.COM/x", policy).host == "hooks.example.com"
    with pytest.raises(UrlNotAllowed):
        parse_webhook_url("https://EXAMPLE.ORG/x", policy)
    with pytest.raises(UrlNotAllowed):
        parse_webhook_url("https://BadExample.org/x", policy)


def test_trailing_dot_on_the_host_is_ignored() -> None:
    policy = UrlPolicy(allowed_domains=("hooks.example.com",))
    assert parse_webhook_url("https://hooks.example.com./x", policy).host == "hooks.example.com"


# --- parse_webhook_url ---------------------------------------------------------------------------


def test_https_url_parses_into_a_target() -> None:
    target = parse_webhook_url("https://hooks.example.com/xmtp?x=1", STRICT)
    assert target == WebhookTarget(
        url="https://hooks.example.com/xmtp?x=1", scheme="https", host="hooks.example.com", port=443
    )


def test_explicit_port_is_kept() -> None:
    assert parse_webhook_url("https://hooks.example.com:8443/x", STRICT).port == 8443
    assert parse_webhook_url("http://hooks.example.com:8080/x", OPEN).port == 8080


def test_scheme_is_case_insensitive() -> None:
    assert parse_webhook_url("HTTPS://hooks.example.com/", STRICT).scheme == "https"


@pytest.mark.parametrize(
    "url", ["http://hooks.example.com/x", "HTTP://hooks.example.com/x", "ftp://hooks.example.com/x"]
)
def test_plain_http_and_other_schemes_are_refused_by_default(url: str) -> None:
    with pytest.raises(UrlNotAllowed):
        parse_webhook_url(url, STRICT)


def test_http_is_allowed_only_when_insecure_targets_are() -> None:
    target = parse_webhook_url("http://hooks.example.com/x", UrlPolicy(allow_insecure=True))
    assert target.scheme == "http" and target.port == 80


@pytest.mark.parametrize(
    "url",
    [
        "ftp://hooks.example.com/x",
        "ws://hooks.example.com/x",
        "file:///etc/passwd",
        "javascript:alert(1)",
        "hooks.example.com/x",
        "//hooks.example.com/x",
        "",
    ],
)
def test_non_http_schemes_are_refused_even_when_insecure(url: str) -> None:
    with pytest.raises(UrlNotAllowed):
        parse_webhook_url(url, OPEN)


@pytest.mark.parametrize(
    "url",
    [
        "https://user@hooks.example.com/x",
        "https://user:pass@hooks.example.com/x",
        "https://:pass@hooks.example.com/x",
        "https://@hooks.example.com/x",
        "https://hooks.example.com@evil.example.net/x",
        "https://user%40x:p@hooks.example.com/x",
    ],
)
def test_userinfo_is_refused(url: str) -> None:
    with pytest.raises(UrlNotAllowed):
        parse_webhook_url(url, OPEN)


@pytest.mark.parametrize("url", ["https:///x", "https://", "https://:443/x", "https://./x", "https:x"])
def test_missing_host_is_refused(url: str) -> None:
    with pytest.raises(UrlNotAllowed):
        parse_webhook_url(url, OPEN)


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com:99999/x",
        "https://hooks.example.com:65536/x",
        "https://hooks.example.com:abc/x",
        "https://hooks.example.com:-1/x",
        "https://hooks.example.com:0/x",
        "https://hooks.example.com:1:2/x",
    ],
)
def test_bad_port_is_refused(url: str) -> None:
    with pytest.raises(UrlNotAllowed):
        parse_webhook_url(url, OPEN)


def test_ipv6_literal_hosts_parse_without_brackets() -> None:
    target = parse_webhook_url("https://[2606:4700:4700::1111]:8443/x", STRICT)
    assert target.host == "2606:4700:4700::1111" and target.port == 8443
    assert parse_webhook_url("https://[::1]/x", STRICT).host == "::1"


def test_ipv6_literal_host_is_lowercased() -> None:
    assert parse_webhook_url("https://[2606:4700:4700::ABCD]/x", STRICT).host == "2606:4700:4700::abcd"


@pytest.mark.parametrize("url", ["https://[::1/x", "https://::1/x", "https://[not-an-ip]/x"])
def test_malformed_ipv6_literals_are_refused(url: str) -> None:
    with pytest.raises(UrlNotAllowed):
        parse_webhook_url(url, OPEN)


def test_host_outside_the_allowed_domains_is_refused_before_resolution() -> None:
    policy = UrlPolicy(allowed_domains=("*.example.org",))
    with pytest.raises(UrlNotAllowed):
        parse_webhook_url("https://hooks.example.com/x", policy)


def test_url_not_allowed_never_echoes_the_url() -> None:
    url = "https://secret-user:secret-pass@secret-host.example.org:99999/secret-path"
    with pytest.raises(UrlNotAllowed) as raised:
        parse_webhook_url(url, STRICT)
    for fragment in ("secret-host", "secret-user", "secret-pass", "secret-path", "99999"):
        assert fragment not in str(raised.value)
        assert fragment not in repr(raised.value)
    assert raised.value.__cause__ is None
    assert raised.value.__suppress_context__


# --- resolve_host --------------------------------------------------------------------------------


async def test_resolve_host_returns_ip_literals_as_they_are() -> None:
    assert await resolve_host("8.8.8.8", 443) == ("8.8.8.8",)
    assert await resolve_host("2606:4700:4700::1111", 443) == ("2606:4700:4700::1111",)
    assert await resolve_host("[::1]", 443) == ("::1",)


async def test_resolve_host_finds_localhost_on_loopback() -> None:
    addresses = await resolve_host("localhost", 443)
    assert addresses
    assert all(ip(a).is_loopback for a in addresses)
    assert all(is_blocked_address(ip(a)) for a in addresses)


async def test_resolve_host_gives_nothing_for_an_unresolvable_name() -> None:
    assert await resolve_host("no-such-host.invalid", 443) == ()


async def test_overlapping_lookups_of_one_name_share_one_resolution_and_later_ones_resolve_again() -> None:
    lookups = SharedLookups()
    answers = await asyncio.gather(*(lookups.resolve("localhost", 443) for _ in range(50)))
    assert answers[0] and all(answer is answers[0] for answer in answers)  # one tuple: one lookup
    assert lookups._in_flight == {}
    again = await lookups.resolve("localhost", 443)
    assert again == answers[0] and again is not answers[0]  # resolved afresh, not remembered
    other_port = await asyncio.gather(lookups.resolve("localhost", 443), lookups.resolve("localhost", 80))
    assert other_port[0] is not other_port[1]


async def test_a_cancelled_waiter_leaves_the_shared_lookup_to_the_others() -> None:
    lookups = SharedLookups()
    first = asyncio.create_task(lookups.resolve("localhost", 443))
    second = asyncio.create_task(lookups.resolve("localhost", 443))
    await asyncio.sleep(0)
    first.cancel()
    assert await second
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_resolve_host_does_not_repeat_addresses() -> None:
    addresses = await resolve_host("localhost", 443)
    assert len(addresses) == len(set(addresses))


# --- check_webhook_url ---------------------------------------------------------------------------


async def test_public_ip_literal_passes_and_carries_its_address() -> None:
    checked = await check_webhook_url("https://8.8.8.8/hook", STRICT)
    assert isinstance(checked, CheckedWebhook)
    assert checked.target.host == "8.8.8.8" and checked.target.port == 443
    assert checked.addresses == ("8.8.8.8",)


async def test_public_ipv6_literal_passes() -> None:
    checked = await check_webhook_url("https://[2606:4700:4700::1111]:8443/hook", STRICT)
    assert checked.addresses == ("2606:4700:4700::1111",)
    assert checked.target.port == 8443


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/x",
        "https://10.0.0.1/x",
        "https://169.254.169.254/latest/meta-data",
        "https://[::1]/x",
        "https://[::]/x",
        "https://[fe80::1]/x",
        "https://[fe80::1%25eth0]/x",
        "https://[fd00::1]/x",
        "https://[::ffff:127.0.0.1]/x",
        "https://[::ffff:7f00:1]/x",
        "https://[::ffff:169.254.169.254]/x",
        "https://0.0.0.0/x",
        # Other spellings of 127.0.0.1 that the system resolver accepts.
        "https://2130706433/x",
        "https://0x7f000001/x",
        "https://127.1/x",
    ],
)
async def test_private_targets_are_refused(url: str) -> None:
    with pytest.raises(UrlNotAllowed):
        await check_webhook_url(url, STRICT)


async def test_localhost_is_refused_unless_private_addresses_are_allowed() -> None:
    with pytest.raises(UrlNotAllowed):
        await check_webhook_url("https://localhost/x", STRICT)
    checked = await check_webhook_url("https://localhost:8443/x", UrlPolicy(allow_private_addresses=True))
    assert checked.target.host == "localhost" and checked.target.port == 8443
    assert checked.addresses and all(ip(a).is_loopback for a in checked.addresses)


async def test_allowing_private_addresses_does_not_allow_http() -> None:
    with pytest.raises(UrlNotAllowed):
        await check_webhook_url("http://127.0.0.1/x", UrlPolicy(allow_private_addresses=True))
    checked = await check_webhook_url("http://127.0.0.1:9/x", OPEN)
    assert checked.addresses == ("127.0.0.1",)


async def test_unresolvable_host_is_refused_even_when_private_is_allowed() -> None:
    for policy in (STRICT, OPEN):
        with pytest.raises(UrlNotAllowed) as raised:
            await check_webhook_url("https://no-such-host.invalid/x", policy)
        assert "no-such-host" not in str(raised.value)


async def test_allowed_domain_that_resolves_private_is_still_refused() -> None:
    policy = UrlPolicy(allowed_domains=("localhost",))
    with pytest.raises(UrlNotAllowed):
        await check_webhook_url("https://localhost/x", policy)


async def test_domain_list_applies_to_ip_literals_too() -> None:
    policy = UrlPolicy(allowed_domains=("*.example.org",))
    with pytest.raises(UrlNotAllowed):
        await check_webhook_url("https://8.8.8.8/x", policy)


def _hosts_file_names() -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    try:
        lines = Path("/etc/hosts").read_text().splitlines()
    except OSError:
        return names
    for line in lines:
        fields = line.split("#", 1)[0].split()
        for name in fields[1:]:
            names.setdefault(name.lower(), set()).add(fields[0])
    return names


async def test_one_private_address_among_several_refuses_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    # No public test name resolves to a mix of public and private addresses, so
    # the resolver is replaced: every address counts, not only the first.
    seen: list[tuple[str, int]] = []

    async def fake_resolve(host: str, port: int) -> tuple[str, ...]:
        seen.append((host, port))
        return ("93.184.216.34", "2606:4700:4700::1111", "10.0.0.7")

    monkeypatch.setattr(url_policy, "resolve_host", fake_resolve)
    with pytest.raises(UrlNotAllowed):
        await check_webhook_url("https://hooks.example.com:8443/x", STRICT)
    assert seen == [("hooks.example.com", 8443)]

    checked = await check_webhook_url(
        "https://hooks.example.com:8443/x", UrlPolicy(allow_private_addresses=True)
    )
    assert checked.addresses == ("93.184.216.34", "2606:4700:4700::1111", "10.0.0.7")


@pytest.mark.parametrize("private", ["127.0.0.1", "::1", "::ffff:192.168.0.1", "fe80::1%eth0", "169.254.1.1"])
async def test_private_address_in_any_position_refuses_the_host(
    monkeypatch: pytest.MonkeyPatch, private: str
) -> None:
    async def fake_resolve(host: str, port: int) -> tuple[str, ...]:
        return ("8.8.8.8", private)

    monkeypatch.setattr(url_policy, "resolve_host", fake_resolve)
    with pytest.raises(UrlNotAllowed):
        await check_webhook_url("https://hooks.example.com/x", STRICT)


async def test_all_public_addresses_pass_and_are_all_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_resolve(host: str, port: int) -> tuple[str, ...]:
        return ("93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946")

    monkeypatch.setattr(url_policy, "resolve_host", fake_resolve)
    checked = await check_webhook_url("https://hooks.example.com/x", STRICT)
    assert checked.addresses == ("93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946")
    assert checked.target.host == "hooks.example.com"


async def test_hosts_file_name_with_a_private_address_is_refused() -> None:
    # With the real resolver: /etc/hosts names mapped to loopback or private space.
    candidates = [
        name
        for name, addresses in sorted(_hosts_file_names().items())
        if any(_is_ip(a) and is_blocked_address(ip(a.split("%", 1)[0])) for a in addresses)
    ]
    tested = 0
    for name in candidates[:5]:
        addresses = await resolve_host(name, 443)
        if not any(is_blocked_address(ip(a.split("%", 1)[0])) for a in addresses):
            continue  # the resolver disagrees with /etc/hosts; nothing to assert
        with pytest.raises(UrlNotAllowed):
            await check_webhook_url(f"https://{name}/x", STRICT)
        checked = await check_webhook_url(f"https://{name}/x", UrlPolicy(allow_private_addresses=True))
        assert checked.addresses == addresses
        tested += 1
    if not tested:
        pytest.skip("no /etc/hosts name resolves to a private address")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return False
    return True


def test_policy_from_settings_copies_the_http_settings() -> None:
    from app.core.config import Settings

    settings = Settings(
        webhook_allow_insecure=True,
        webhook_allowed_domains="*.Example.org, hooks.example.com",  # type: ignore[arg-type]
        webhook_allow_private_addresses=True,
    )
    # This host's own addresses are read at start-up, apart from the settings.
    policy = dataclasses.replace(UrlPolicy.from_settings(settings), own_addresses=frozenset())
    assert policy == UrlPolicy(
        allow_insecure=True,
        allowed_domains=("*.example.org", "hooks.example.com"),
        allow_private_addresses=True,
    )
    closed = Settings(
        webhook_allow_insecure=False, webhook_allowed_domains=(), webhook_allow_private_addresses=False
    )
    assert dataclasses.replace(UrlPolicy.from_settings(closed), own_addresses=frozenset()) == UrlPolicy()
