"""Throwaway PostgreSQL clusters and free loopback ports for Python tests and benchmarks: a thin
layer over scripts/cluster, the one implementation (initdb, settings, pg_ctl, port reservations).

Import it by path::

    sys.path.insert(0, str(ROOT / "scripts"))
    import cluster

    port = cluster.free_port()                    # reserved for this process while it lives
    pg = cluster.Cluster(tmp / "data", tcp=True, preload=True, no_fsync=True,
                         settings={"max_connections": "200"})
    pg.start()
    ... pg.dsn("postgres"), pg.env(), pg.psql("postgres", "SELECT 1") ...
    pg.stop()
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Mapping, Optional

SCRIPT = Path(__file__).resolve().with_name("cluster")


def _run(*args: object) -> str:
    done = subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/cluster {' '.join(map(str, args))} failed:\n"
                           f"{done.stderr.strip()}")
    return done.stdout


def free_port(count: int = 1) -> int:
    """A free TCP port on 127.0.0.1 (the first of ``count`` consecutive ones) from
    IDEMPOTENCY_PORTS, reserved for this process as long as it lives."""
    return int(_run("port", "--count", count, "--holder", os.getpid()))


def bindir() -> Path:
    """The PostgreSQL binaries scripts/cluster uses: $PGBIN, else $PG_CONFIG's, else 15's."""
    if os.environ.get("PGBIN"):
        return Path(os.environ["PGBIN"])
    pg_config = os.environ.get("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
    return Path(subprocess.run([pg_config, "--bindir"], check=True, capture_output=True,
                               text=True).stdout.strip())


class Cluster:
    """A new cluster in ``data`` (which must not exist yet), configured but not started.

    ``socket``: the unix socket directory (default: ``data``'s parent); ``port``: a number, or
    None for a free one (reserved for this process); ``tcp``: also listen on 127.0.0.1;
    ``preload``: shared_preload_libraries = 'idempotency'; ``no_fsync``: fsync = off;
    ``settings``: more settings, values in postgresql.conf syntax (strings quoted);
    ``auth_host``: the TCP authentication (default trust); ``template``: a stopped data
    directory to copy instead of running initdb."""

    def __init__(self, data: Path, *, socket: Optional[Path] = None, port: Optional[int] = None,
                 tcp: bool = False, preload: bool = False, no_fsync: bool = False,
                 settings: Optional[Mapping[str, str]] = None, auth_host: Optional[str] = None,
                 template: Optional[Path] = None, log: Optional[Path] = None) -> None:
        self.data = Path(data).resolve()
        self.log = Path(log) if log else self.data / "server.log"
        args: list[object] = ["init", self.data]
        if socket is not None:
            args += ["--socket", socket]
        args += ["--port", port if port is not None else free_port()]
        if tcp:
            args.append("--tcp")
        if preload:
            args.append("--preload")
        if no_fsync:
            args.append("--no-fsync")
        for name, value in (settings or {}).items():
            args += ["--set", f"{name}={value}"]
        if auth_host:
            args += ["--auth-host", auth_host]
        if template is not None:
            args += ["--from", template]
        _run(*args)
        params = dict(item.split("=", 1) for item in _run("dsn", self.data).split())
        self.socket = Path(params["host"])
        self.port = int(params["port"])
        self.user = params["user"]
        self.bindir = bindir()

    def start(self, timeout: int = 120) -> None:
        _run("start", self.data, "--log", self.log, "--timeout", timeout)

    def restart(self, timeout: int = 120) -> None:
        _run("restart", self.data, "--log", self.log, "--timeout", timeout)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server if it runs (``mode``: fast, immediate or smart)."""
        _run("stop", self.data, "--mode", mode)

    def running(self) -> bool:
        return subprocess.run(["bash", str(SCRIPT), "status", str(self.data)]).returncode == 0

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.socket} port={self.port} user={self.user} dbname={dbname}"

    def env(self, dbname: str = "postgres") -> dict[str, str]:
        """The libpq variables that point a client at this cluster over its unix socket."""
        return {"PGHOST": str(self.socket), "PGPORT": str(self.port), "PGUSER": self.user,
                "PGDATABASE": dbname}

    def psql(self, dbname: str, sql: str) -> str:
        """Run ``sql`` with psql (stop at the first error); its unaligned output, stripped."""
        return subprocess.run(
            [self.bindir / "psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
             "-h", str(self.socket), "-p", str(self.port), "-U", self.user, "-d", dbname,
             "-c", sql], check=True, capture_output=True, text=True).stdout.strip()

    def read_log(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop("immediate")
