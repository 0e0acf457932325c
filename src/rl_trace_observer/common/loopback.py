"""Which ``Host`` headers a server on 127.0.0.1 answers: loopback names only (DNS rebinding).

A server bound to loopback is still reachable from any web page the user opens: the page's host
name can be re-pointed (DNS rebinding) to 127.0.0.1, and the browser then lets the page read the
answers, because to the browser they come from the page's own origin. What gives it away is the
``Host`` header, which still carries the page's name. So a loopback server (``rl-trace view``, the
live dashboard) answers only requests whose ``Host`` is a loopback name - ``localhost``,
``127.x.y.z``, ``[::1]``, with or without a port - and refuses the rest (:data:`REFUSED_STATUS`).
Stdlib only.
"""

from __future__ import annotations

import ipaddress
import re

__all__ = ["REFUSED_STATUS", "is_loopback_host", "refusal"]

REFUSED_STATUS = 403
_PORT = re.compile(r"\d{1,5}")


def is_loopback_host(header: str | None) -> bool:
    """True for a ``Host`` header naming this machine's loopback: ``localhost``, an IPv4 address in
    127.0.0.0/8 or ``[::1]`` (IPv6 in brackets), each optionally ``:port``; a missing header, any
    other name (``localhost.evil.com``, ``127.0.0.1.nip.io``) or a malformed one is False."""
    if not header:
        return False
    host = header.strip()
    if host.startswith("["):  # [v6] or [v6]:port
        end = host.find("]")
        if end < 0:
            return False
        name, rest = host[1:end], host[end + 1 :]
        if rest and not (rest.startswith(":") and _PORT.fullmatch(rest[1:])):
            return False
        return _loopback_address(name, version=6)
    name, colon, port = host.partition(":")
    if colon and not _PORT.fullmatch(port):
        return False
    name = name.lower().removesuffix(".")  # "localhost." is the same name, fully qualified
    return name == "localhost" or _loopback_address(name, version=4)


def _loopback_address(text: str, version: int) -> bool:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    return address.version == version and address.is_loopback


def refusal(header: str | None) -> str:
    """The one-line body a refused request gets."""
    shown = (header or "").encode("ascii", "backslashreplace").decode("ascii")[:200]
    return (
        f"Host {shown!r} is not a loopback name: this server answers only http://127.0.0.1, "
        "http://localhost or http://[::1] (a guard against DNS rebinding)"
    )
