"""A raw HTTP/1.1 client for the tests: the request goes on the wire exactly as given (repeated
header lines, an undecoded target, any bytes in a value), which common clients refuse or
normalise."""

from __future__ import annotations

import http.client
import socket
from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> Optional[str]:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None


def send(port: int, method: str, target: str, headers: Sequence[tuple[str, str]] = (),
         body: Optional[bytes] = None, timeout: float = 120, chunked: bool = False) -> Answer:
    """One request on its own connection (``Connection: close``), its answer read to the end.
    ``chunked``: the body goes in chunks of 16384 bytes. A server may answer before it has
    read the whole body (a 413) and close: the answer is read even if writing fails."""
    lines = [f"{method} {target} HTTP/1.1".encode("utf-8"), b"Host: 127.0.0.1"]
    lines += [name.encode("utf-8") + b": " + value.encode("utf-8") for name, value in headers]
    if chunked:
        lines.append(b"Transfer-Encoding: chunked")
        data = b"".join(b"%x\r\n%s\r\n" % (len(part), part)
                        for part in (body[i:i + 16384] for i in range(0, len(body or b""), 16384))
                        ) + b"0\r\n\r\n"
    else:
        if body is not None:
            lines.append(b"Content-Length: %d" % len(body))
        data = body or b""
    lines.append(b"Connection: close")
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered and closed early: the answer is in the socket's buffer
        response = http.client.HTTPResponse(sock, method=method)
        response.begin()
        try:
            return Answer(response.status, response.getheaders(), response.read())
        finally:
            response.close()
