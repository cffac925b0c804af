"""docs/scale-out.md runs as written: its `guide:` blocks, extracted from the file, run literally
with bash on fresh servers (2 partitions, 2 proxies, then 2 more partitions for the resharding),
as the operating system user that runs PostgreSQL; the application calls the proxies as role
`app`, the resharding tool runs as `idem_admin`, as the guide says."""

import os
import subprocess

import psycopg
import pytest

from guide import guide_blocks
from pgcluster import BINDIR, HERE, throwaway

SETTINGS = {"max_connections": "40", "log_min_messages": "warning"}

SCOPES = [f"g-{i}" for i in range(40)]
PASSWORD = "guide-password"


class Server:
    """A fresh PostgreSQL server (scripts/cluster, a copy of the template) on its own socket
    directory, port 5432 (the guide's default), without the extension preloaded: the guide's
    blocks do that."""

    def __init__(self, root, name, template):
        self.name, self.host = name, str(root / name)
        self.server = throwaway.Cluster(root / name / "data", socket=root / name, port=5432,
                                        no_fsync=True, settings=SETTINGS, template=template)
        self.data = self.server.data
        self.server.start()

    def query(self, dbname, sql, user=None):
        with psycopg.connect(host=self.host, dbname=dbname, user=user, autocommit=True) as conn:
            return conn.execute(sql).fetchall()

    def stop(self):
        self.server.stop("immediate")


@pytest.fixture(scope="module")
def servers(root):
    base = root / "guide"
    template = base / "template"
    throwaway.Cluster(template, socket=base, port=5432, no_fsync=True)
    made = {}
    try:
        for name in ("p0", "p1", "proxy1", "proxy2", "p2", "p3"):
            made[name] = Server(base, name, template)
        yield made
    finally:
        for server in made.values():
            server.stop()


def run_block(name, server, root, **variables):
    """The guide's block, as written, with bash, from the repository's top directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(PATH=f"{BINDIR}:{os.environ['PATH']}", PGHOST=server.host, PGDATA=str(server.data),
               APP_PROXY_PASSWORD=PASSWORD, **variables)
    out = root / f"guide-{name}-{server.name}.out"
    with open(out, "w") as file:    # a file, not a pipe: the restarted server keeps it open
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", guide_blocks()[name]], cwd=HERE.parent,
                              env=env, stdout=file, stderr=subprocess.STDOUT, timeout=300)
    text = out.read_text()
    assert done.returncode == 0, f"guide:{name} on {server.name} failed:\n{text}"
    return text


def test_the_guide_runs_as_written(servers, root):
    s = servers
    hosts = {f"HOST{i}": s[f"p{i}"].host for i in range(4)}
    hosts.update(PROXY1=s["proxy1"].host, PROXY2=s["proxy2"].host)

    # setting it up: 2 partitions, 2 proxies
    for i in (0, 1):
        run_block("partition-server", s[f"p{i}"], root, **hosts)
        run_block("partition-configure", s[f"p{i}"], root, I=str(i), N="2", **hosts)
        assert s[f"p{i}"].query("app", "SHOW shared_preload_libraries") == [("idempotency",)]
        assert s[f"p{i}"].query("app", "SELECT partition, partitions, accepting FROM idem_partition.config"
                                ) == [(i, 2, True)]
    for proxy in ("proxy1", "proxy2"):
        run_block("proxy-server", s[proxy], root, **hosts)
    assert "claimed" in run_block("try", s["proxy1"], root, **hosts)

    # the application, as role app, through both proxies (the proxies connect as app_proxy)
    def app(proxy):
        return psycopg.connect(host=s[proxy].host, dbname="proxy", user="app", autocommit=True)

    with app("proxy1") as px:
        for scope in SCOPES:
            px.execute("SELECT idem_claim('paid', scope => %s)", [scope])
            px.execute("SELECT idem_complete('paid', '{\"ok\": true}', 201, scope => %s)", [scope])
            px.execute("SELECT idem_claim('working', scope => %s, lease => '1 hour')", [scope])
    with app("proxy2") as px:
        assert px.execute("SELECT idem_forget('k1', scope => 'acme', force => true)").fetchone() == (True,)
        assert px.execute("SELECT count(*) FROM idem_partition_stats() WHERE available").fetchone() == (2,)

    # resharding to 4: the new partitions installed like the others, then the guide's command
    for i in (2, 3):
        run_block("partition-server", s[f"p{i}"], root, **hosts)
    run_block("reshard", s["proxy1"], root, **hosts)

    for i in range(4):
        assert s[f"p{i}"].query("app", "SELECT partition, partitions, accepting FROM idem_partition.config"
                                ) == [(i, 4, True)]
    for proxy in ("proxy1", "proxy2"):
        options = s[proxy].query("proxy", "SELECT srvoptions FROM pg_foreign_server WHERE srvname = 'idempotency'")
        assert options[0][0] == [f"p{i}=host={s[f'p{i}'].host} dbname=app" for i in range(4)]
        with app(proxy) as px:
            for scope in SCOPES:
                assert px.execute("SELECT outcome, response_code FROM idem_claim('paid', scope => %s)", [scope]
                                  ).fetchone() == ("replay", 201)
                assert px.execute("SELECT outcome FROM idem_claim('working', scope => %s)", [scope]
                                  ).fetchone() == ("in_progress",)
            assert px.execute("SELECT partition, partitions, accepting, available FROM idem_partition_stats()"
                              " ORDER BY 1").fetchall() == [(i, 4, True, True) for i in range(4)]
    with psycopg.connect(host=s["proxy1"].host, dbname="proxy", user="app") as px:
        where = {scope: px.execute("SELECT idem_partition.idem_scope_partition(%s, 4)", [scope]).fetchone()[0]
                 for scope in SCOPES}
    held = {}
    for i in range(4):
        for (scope,) in s[f"p{i}"].query("app", "SELECT scope FROM idem_keys WHERE key = 'paid'"):
            held.setdefault(scope, []).append(i)
    assert held == {scope: [where[scope]] for scope in SCOPES}
