"""Loopback helpers of the tests: free ports (the repository's scripts/cluster hands them out,
reserved for this process), and a TCP proxy in front of PostgreSQL that counts exchanges on the
wire."""

from __future__ import annotations

import socket
import struct
import sys
import threading
from pathlib import Path
from typing import Optional

from psycopg.conninfo import conninfo_to_dict, make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
from cluster import free_port  # noqa: E402

__all__ = ["ExchangeCounter", "free_port"]


class ExchangeCounter:
    """A proxy on 127.0.0.1 in front of the server of ``dsn`` that counts the server's
    ReadyForQuery messages: the server sends one at the end of every exchange (a simple query,
    or extended-protocol messages up to a Sync), so their count is the number of round trips,
    whatever the client library does between them. Counted before they are passed on: when the
    client has read an answer, its ReadyForQuery is counted."""

    def __init__(self, dsn: str) -> None:
        params = conninfo_to_dict(dsn)
        host, port = str(params.get("host", "/tmp")), str(params.get("port", "5432"))
        self._upstream: object = (f"{host}/.s.PGSQL.{port}" if host.startswith("/")
                                  else (host, int(port)))
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", free_port()))
        self._listener.listen()
        self.port = self._listener.getsockname()[1]
        # the server's first bytes must be typed messages: no SSL or GSS negotiation
        self.dsn = make_conninfo(dsn, host="127.0.0.1", port=self.port, sslmode="disable",
                                 gssencmode="disable")
        self._lock = threading.Lock()
        self._ready = 0
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._start(self._accept)

    @property
    def ready(self) -> int:
        """ReadyForQuery messages the server has sent so far, on every proxied connection."""
        with self._lock:
            return self._ready

    def close(self) -> None:
        try:  # wakes the accepting thread (closing alone does not, on Linux)
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in self._threads:
            t.join(10)

    def __enter__(self) -> "ExchangeCounter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            family = socket.AF_UNIX if isinstance(self._upstream, str) else socket.AF_INET
            server = socket.socket(family)
            server.connect(self._upstream)  # type: ignore[arg-type]
            with self._lock:
                self._sockets += [client, server]
            self._start(self._pass, client, server, None)
            self._start(self._pass, server, client, bytearray())

    def _pass(self, source: socket.socket, sink: socket.socket,
              pending: Optional[bytearray]) -> None:
        """Copy ``source`` to ``sink``; from the server, parse the messages (type byte, then a
        length that counts itself) to count ReadyForQuery ('Z')."""
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if pending is not None:
                    pending += data
                    while len(pending) >= 5:
                        (length,) = struct.unpack_from("!i", pending, 1)
                        if len(pending) < 1 + length:
                            break
                        if pending[0] == ord("Z"):
                            with self._lock:
                                self._ready += 1
                        del pending[:1 + length]
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
