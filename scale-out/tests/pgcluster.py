"""Throwaway PostgreSQL clusters for the scale-out tests: unix sockets only, under one temp dir,
binaries from $PG_CONFIG (default: Debian's PostgreSQL 15)."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

PG_CONFIG = os.environ.get("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
BINDIR = Path(subprocess.run([PG_CONFIG, "--bindir"], check=True, capture_output=True,
                             text=True).stdout.strip())
HERE = Path(__file__).resolve().parent.parent          # scale-out/
FIRST_PORT = int(os.environ.get("IDEMPOTENCY_SCALEOUT_PORT", "18000"))


class Cluster:
    """One PostgreSQL server with a database "idem"."""

    def __init__(self, root: Path, name: str, port: int, template: Path, conf: str = ""):
        self.name, self.port = name, port
        self.data = root / name
        self.socket_dir = root / "sock"
        shutil.copytree(template, self.data)
        with open(self.data / "postgresql.conf", "a") as file:
            file.write(f"port = {port}\n{conf}")
        self.start()
        self.psql_script("postgres", "CREATE DATABASE idem")

    @property
    def dsn(self) -> str:
        return f"host={self.socket_dir} port={self.port} dbname=idem"

    def start(self) -> None:
        subprocess.run([BINDIR / "pg_ctl", "-D", self.data, "-l", self.data / "server.log", "-w",
                        "-t", "120", "start"], check=True, stdout=subprocess.DEVNULL)

    def stop(self, mode: str = "fast") -> None:
        subprocess.run([BINDIR / "pg_ctl", "-D", self.data, "-m", mode, "-w", "stop"],
                       check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

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
        return (self.data / "server.log").read_text(errors="replace")


class Deployment:
    """N partitions (each with the extension, its reaper and schema idem_partition) and a proxy."""

    def __init__(self, root: Path, partitions: int, spare: int = 0, first_port: int = FIRST_PORT,
                 extra_conf: str = "", proxies: int = 1):
        self.root = root
        template = root / "template"
        if not template.exists():
            subprocess.run([BINDIR / "initdb", "-D", template, "-A", "trust", "-E", "UTF8",
                            "--locale=C.UTF-8"], check=True, stdout=subprocess.DEVNULL)
            with open(template / "postgresql.conf", "a") as conf:
                conf.write(f"""listen_addresses = ''
unix_socket_directories = '{root / "sock"}'
shared_preload_libraries = 'idempotency'
idempotency.reaper_naptime = 1s
idempotency.reaper_databases = 'idem'
max_connections = 80
fsync = off
log_min_messages = warning
{extra_conf}""")
            (root / "sock").mkdir(exist_ok=True)
        port = first_port
        self.partitions = []
        for i in range(partitions + spare):
            cluster = Cluster(root, f"p{port}", port, template)
            cluster.psql_script("idem", "CREATE EXTENSION idempotency")
            cluster.psql_script("idem", file=HERE / "sql" / "partition.sql")
            if i < partitions:
                cluster.psql_script("idem", f"SELECT idem_partition.configure({i}, {partitions})")
            self.partitions.append(cluster)
            port += 1
        # the proxies have no keys: no reaper coming and going there
        self.proxies = []
        for _ in range(proxies):
            proxy = Cluster(root, f"proxy{port}", port, template, "idempotency.reaper_enabled = off\n")
            proxy.psql_script("idem", file=HERE / "sql" / "proxy.sql")
            self.proxies.append(proxy)
            port += 1
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
