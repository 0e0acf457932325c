"""A small JSON client for TokenSpeed's control port (aiohttp, imported when first used).

One connection per request (``force_close``): TokenSpeed's control server is a proxy that may drop
idle keep-alive connections, and a request on a half-closed pooled connection fails spuriously.
"""

from __future__ import annotations

from typing import Any

import orjson


class ControlClient:
    def __init__(self, base_url: str, default_timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.default_timeout_s = default_timeout_s
        self._session: Any = None

    async def _get_session(self) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        return self._session

    async def request(
        self, method: str, path: str, body: Any = None, *, timeout_s: float | None = None
    ) -> tuple[int, Any]:
        """(HTTP status, decoded JSON or the text when it is not JSON)."""
        import aiohttp

        session = await self._get_session()
        data = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.default_timeout_s)
        async with session.request(
            method, self.base_url + path, data=data, headers=headers, timeout=timeout
        ) as resp:
            raw = await resp.read()
            try:
                return resp.status, orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                return resp.status, raw.decode(errors="replace")

    async def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return await self.request("POST", path, body, **kw)

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()


def reply_ok(status: int, reply: Any) -> bool:
    """TokenSpeed's control replies: ``{success, message}`` (RL routes) or HTTP 200 (gateway)."""
    if status != 200:
        return False
    return not (isinstance(reply, dict) and reply.get("success") is False)


def reply_message(reply: Any) -> str:
    if isinstance(reply, dict):
        for key in ("message", "detail", "error"):
            if reply.get(key):
                return str(reply[key])
    return str(reply)[:300]
