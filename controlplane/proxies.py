"""Which address a request comes from, behind the proxies the deployment trusts.

Login lockouts, API throttles per address and the counts of anonymous rejections key on the
client's address. Behind an Ingress every request arrives from the proxy's address, so that
alone would lock every client out together (and let anyone lock any user out). The proxy names
the client in ``X-Forwarded-For``, but so can anyone: the header is believed only from the
proxies listed in `EPOCHAL_TRUSTED_PROXIES` (addresses or networks, comma-separated; the Helm
chart sets the cluster's pod network). The client is then the rightmost address of
``X-Forwarded-For`` that is not itself a trusted proxy — what a client writes into the header
lands to the left of what the proxies append, and is never taken.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from django.conf import settings

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=8)
def _networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    """EPOCHAL_TRUSTED_PROXIES as networks (`controlplane.config.trusted_proxies` checked it)."""
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def _trusted(text: str, networks: Sequence[Network]) -> bool:
    address = _address(text)
    return address is not None and any(address in network for network in networks)


def client_address(request: Any) -> str:
    """The address `request` comes from: REMOTE_ADDR, or — when that is a trusted proxy — the
    rightmost untrusted address of X-Forwarded-For."""
    meta = getattr(request, "META", {})
    remote = str(meta.get("REMOTE_ADDR") or "unknown")
    networks = _networks(tuple(settings.EPOCHAL_TRUSTED_PROXIES))
    if not networks or not _trusted(remote, networks):
        return remote
    hops = [h.strip() for h in str(meta.get("HTTP_X_FORWARDED_FOR", "")).split(",") if h.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, networks):
            return hop if _address(hop) is not None else remote
    return remote
