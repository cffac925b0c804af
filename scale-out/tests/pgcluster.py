"""Throwaway PostgreSQL clusters for the scale-out tests and benchmark, made by the repository's
scripts/cluster: unix sockets only, under one temp dir, binaries from $PG_CONFIG (default:
Debian's PostgreSQL 15)."""

import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent.parent          # scale-out/
sys.path.insert(0, str(HERE.parent / "scripts"))
import cluster as throwaway  # noqa: E402

BINDIR = throwaway.bindir()
# every server of a deployment
SETTINGS = {"idempotency.reaper_naptime": "1s", "idempotency.reaper_databases": "'idem'",
            "max_connections": "80", "log_min_messages": "warning"}


class Cluster:
    """One PostgreSQL server with a database "idem", a copy of the deployment's template on a
    free port (the name of its socket in the deployment's socket directory)."""

    def __init__(self, root: Path, prefix: str, template: Path, settings: dict[str, str]):
        self.port = throwaway.free_port()
        self.name = f"{prefix}{self.port}"
        self.server = throwaway.Cluster(root / self.name, socket=root / "sock", port=self.port,
                                        preload=True, no_fsync=True, settings=settings,
                                        template=template)
        self.data = self.server.data
        self.socket_dir = self.server.socket
        self.start()
        self.psql_script("postgres", "CREATE DATABASE idem")

    @property
    def dsn(self) -> str:
        return f"host={self.socket_dir} port={self.port} dbname=idem"

    def start(self) -> None:
        self.server.start()

    def stop(self, mode: str = "fast") -> None:
        self.server.stop(mode)

    def connect(self, **kwargs) -> psycopg.Connection:
        kwargs.setdefault("autocommit", True)
        return psycopg.connect(self.dsn, **kwargs)

    def psql_script(self, dbname: str, sql: str | None = None, file: Path | None = None) -> str:
        cmd = [BINDIR / "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", self.socket_dir,
               "-p", str(self.port), "-d", dbname]
        cmd += ["-f", file] if file else ["-c", sql]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout

    def query(self, sql: str, params=None) -> list[tuple]:
        with self.connect() as conn:
            return conn.execute(sql, params).fetchall()

    def log(self) -> str:
        return self.server.read_log()


class Deployment:
    """N partitions (each with the extension, its reaper and schema idem_partition) and a proxy."""

    def __init__(self, root: Path, partitions: int, spare: int = 0,
                 settings: dict[str, str] | None = None, proxies: int = 1):
        self.root = root
        template = root / "template"
        if not template.exists():   # made once, copied for every server
            throwaway.Cluster(template, socket=root / "sock", no_fsync=True)
        settings = {**SETTINGS, **(settings or {})}
        self.partitions = []
        for i in range(partitions + spare):
            cluster = Cluster(root, "p", template, settings)
            cluster.psql_script("idem", "CREATE EXTENSION idempotency")
            cluster.psql_script("idem", file=HERE / "sql" / "partition.sql")
            if i < partitions:
                cluster.psql_script("idem", f"SELECT idem_partition.configure({i}, {partitions})")
            self.partitions.append(cluster)
        # the proxies have no keys: no reaper coming and going there
        self.proxies = [Cluster(root, "proxy", template, {**settings, "idempotency.reaper_enabled": "off"})
                        for _ in range(proxies)]
        for proxy in self.proxies:
            proxy.psql_script("idem", file=HERE / "sql" / "proxy.sql")
        self.proxy = self.proxies[0]
        self.configure_proxy(self.partitions[:partitions])

    def configure_proxy(self, partitions: list[Cluster]) -> None:
        import idem_scaleout
        for proxy in self.proxies:
            with proxy.connect() as conn:
                conn.execute(idem_scaleout.proxy_config_sql([p.dsn for p in partitions]))

    def close(self) -> None:
        for cluster in self.partitions + self.proxies:
            cluster.stop("immediate")


def temp_root() -> Path:
    return Path(tempfile.mkdtemp(prefix="idem-scaleout-"))
