"""Throwaway servers for the tests and the benchmark: a PostgreSQL cluster (the repository's
scripts/cluster, binaries from PG_CONFIG, unix socket only) and a RabbitMQ node (loopback only),
both under one temporary directory, run as the current (unprivileged) user and stopped even when a
test fails.

The RabbitMQ node takes six consecutive free ports (scripts/cluster hands them out, reserved for
this process): + 0 epmd, + 1 AMQP, + 2 Erlang distribution, + 3..5 for rabbitmqctl's own
distribution port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pika
import pika.exceptions

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import cluster  # noqa: E402

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")


class Postgres:
    """A cluster under base, the extension preloaded, made and started by start()."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.cluster: cluster.Cluster | None = None

    def env(self, database: str) -> dict[str, str]:
        """The libpq variables that point a client at this cluster."""
        assert self.cluster is not None
        return self.cluster.env(database)

    def start(self, settings: dict[str, str] | None = None) -> None:
        self.cluster = cluster.Cluster(self.base / "pgdata", socket=self.base / "pgsock",
                                       preload=True, log=self.base / "postgres.log",
                                       settings={"max_connections": "50", **(settings or {})})
        self.cluster.start()

    def psql(self, database: str, sql: str) -> str:
        assert self.cluster is not None
        return self.cluster.psql(database, sql)

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop("immediate")


class RabbitMQ:
    """One node, its Erlang cookie, mnesia and logs under base; epmd on a port of our own."""

    def __init__(self, base: Path) -> None:
        port_base = cluster.free_port(6)
        self.base = base / "rabbitmq"
        self.node = f"idem-{os.getpid()}@localhost"
        self.amqp_port = port_base + 1
        self.env = dict(os.environ)
        self.env.update({
            "HOME": str(self.base / "home"),  # the Erlang cookie goes here
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_MNESIA_BASE": str(self.base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.base / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.base / "rabbitmq"),  # + .conf
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.base / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(self.base / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.base / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.base / "rabbitmq.pid"),
            "ERL_EPMD_PORT": str(port_base),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_DIST_PORT": str(port_base + 2),
            "RABBITMQ_CTL_DIST_PORT_MIN": str(port_base + 3),
            "RABBITMQ_CTL_DIST_PORT_MAX": str(port_base + 5),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        })
        self.epmd_port = port_base
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    def ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([RABBITMQ_BIN / "rabbitmqctl", "-n", self.node, *args],
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def start(self) -> None:
        if self.process is None:  # first start: configuration
            (self.base / "home").mkdir(parents=True, exist_ok=True)
            (self.base / "rabbitmq.conf").write_text(
                f"listeners.tcp.1 = 127.0.0.1:{self.amqp_port}\n"
                "loopback_users.guest = true\n"
                "log.console = false\n")
            (self.base / "advanced.config").write_text("[].\n")
            (self.base / "rabbitmq-env.conf").write_text("")
            (self.base / "enabled_plugins").write_text("[].\n")
        with open(self.base / "server.out", "ab") as out:
            self.process = subprocess.Popen([RABBITMQ_BIN / "rabbitmq-server"], env=self.env,
                                            stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 600  # catches a hang: the boot takes over a minute when busy
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited ({self.process.returncode}); "
                                   f"see {self.base / 'server.out'}")
            # The AMQP listener opens when the boot is complete. (rabbitmqctl await_startup
            # would boot an Erlang VM per try: seconds each on a busy machine.)
            try:
                pika.BlockingConnection(pika.URLParameters(self.url)).close()
                return
            except pika.exceptions.AMQPConnectionError:
                time.sleep(0.5)
        raise RuntimeError("rabbitmq-server did not start within 600 s")

    def stop_node(self) -> None:
        """Stop the node (the durable queue and its persistent messages stay on disk)."""
        if self.process is None or self.process.poll() is not None:
            return
        # rabbitmqctl boots an Erlang VM first: about two minutes on a busy machine, so the limit
        # only catches a hang
        self.ctl("stop", timeout=600)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def restart(self) -> None:
        self.stop_node()
        self.start()

    def queue_depth(self, queue: str) -> int:
        """Messages ready in the queue (not those delivered and not yet acknowledged), asked over
        AMQP: rabbitmqctl boots an Erlang VM per call, seconds on a busy machine."""
        with pika.BlockingConnection(pika.URLParameters(self.url)) as connection:
            declared = connection.channel().queue_declare(queue, passive=True)
            return declared.method.message_count

    def stop(self) -> None:
        """Stop the node, then the epmd it started (a daemon outside our process group)."""
        try:
            self.stop_node()
        finally:
            for pid in self._our_epmds():
                os.kill(pid, signal.SIGTERM)

    def _our_epmds(self) -> list[int]:
        """epmd daemons of this node: named epmd, started with our ERL_EPMD_PORT (it inherits
        the node's environment). Read from /proc: procps may not be installed."""
        mine = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if (proc / "comm").read_text().strip() != "epmd":
                    continue
                environ = (proc / "environ").read_bytes().split(b"\0")
            except OSError:  # gone, or not ours to read
                continue
            if f"ERL_EPMD_PORT={self.epmd_port}".encode() in environ:
                mine.append(int(proc.name))
        return mine
