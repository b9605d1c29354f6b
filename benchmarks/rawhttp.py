"""A lean keep-alive HTTP/1.1 client for the benchmarks' load generators.

httpx costs about a millisecond of the client's own CPU per request in Python, which at one
client is half of what is being measured and at many clients makes the load generator the
limit. This client writes the request bytes and reads the answer off one asyncio stream:
status line, headers, then a ``Content-Length`` body, a chunked body, or one read until the
server closes. Nothing else of HTTP (no redirects, no TLS, no compression): enough for
``POST`` of JSON to a local server, which is all the benchmarks send.
"""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import urlsplit

__all__ = ["RawClient"]


class RawClient:
    """One connection: opened on first use, and again when the server closed it (a request that
    finds a reused connection closed before any answer is sent once more on a new one). Answers
    have a ``Content-Length``, a chunked body or end when the server closes (not a 204/304).
    ``resend_on_closed=False``: no resend, the closed connection is the request's error (the chaos
    benchmark counts a server's failures, not a client's retries)."""

    def __init__(self, url: str, timeout: float = 30.0, resend_on_closed: bool = True, method: str = "POST") -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"RawClient speaks plain http://host:port/path, got {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.timeout, self.resend_on_closed = timeout, resend_on_closed
        self._head = (f"{method} {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                      "Content-Type: application/json\r\nContent-Length: ").encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        sock = self._writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def post(self, body: bytes) -> tuple[int, bytes]:
        """``POST`` (or the client's ``method``) ``body`` (JSON) to the URL's path: (status, the answer's body)."""
        return await asyncio.wait_for(self._post(body), self.timeout)

    async def _post(self, body: bytes) -> tuple[int, bytes]:
        reused = self._writer is not None
        if not reused:
            await self._connect()
        reader, writer = self._reader, self._writer
        assert reader is not None and writer is not None
        try:
            writer.write(b"%s%d\r\n\r\n%s" % (self._head, len(body), body))
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                if not reused or not self.resend_on_closed:
                    raise
                await self.close()  # the server closed the idle connection: once more on a new one
                return await self._post(body)
            lines = head[:-4].split(b"\r\n")
            status = int(lines[0].split(None, 2)[1])
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            if b"content-length" in headers:
                data = await reader.readexactly(int(headers[b"content-length"]))
            elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
                chunks = []
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    if size == 0:
                        await reader.readuntil(b"\r\n")  # (no trailers expected)
                        break
                    chunks.append(await reader.readexactly(size))
                    await reader.readexactly(2)
                data = b"".join(chunks)
            else:
                data = await reader.read()
                headers[b"connection"] = b"close"
        except BaseException:
            await self.close()
            raise
        if headers.get(b"connection", b"").lower() == b"close":
            await self.close()
        return status, data

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass
