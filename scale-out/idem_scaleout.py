#!/usr/bin/python3
"""Cluster configuration and resharding for idempotency keys partitioned with PL/Proxy.

    idem_scaleout.py proxy-config DSN0 DSN1 ...     SQL for the proxy: server "idempotency" with
                                                    one partition per DSN (count a power of two)
    idem_scaleout.py partition-config INDEX COUNT   SQL for partition INDEX of COUNT
    idem_scaleout.py reshard --proxy DSN NEW_DSN... double the partitions: partition p's keys whose
                                                    scope now routes to p + old count move there

The DSNs given to proxy-config are what the proxy connects with (no password: put credentials in
the user mapping). The resharding tool connects to the proxy and, with the proxy's connection
strings, to every partition, as the role and password of its own libpq environment (PGUSER,
PGPASSWORD, ~/.pgpass); it needs to be able to lock, copy and delete idem_keys on them.
See docs/scale-out.md.
"""

import argparse
import sys
import time

SERVER = "idempotency"


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def check_partition_count(count: int) -> None:
    if count < 1 or count & (count - 1):
        raise SystemExit(f"the partition count must be a power of two, not {count}")


def proxy_config_sql(dsns: list[str], server: str = SERVER) -> str:
    """One transaction that creates the PL/Proxy server or replaces its partitions.

    PL/Proxy notices the changed options at its next call: every call routes by the new count.
    """
    check_partition_count(len(dsns))
    options = ", ".join(f"p{i} {literal(dsn)}" for i, dsn in enumerate(dsns))
    parts = ", ".join(f"['p{i}', {literal(dsn)}]" for i, dsn in enumerate(dsns))
    return f"""BEGIN;
DO $do$
DECLARE
    wanted text[][] := ARRAY[{parts}];
    changes text[] := '{{}}';
    existing text[];
    option text;
BEGIN
    SELECT srvoptions INTO existing FROM pg_foreign_server WHERE srvname = {literal(server)};
    IF NOT FOUND THEN
        EXECUTE format('CREATE SERVER %I FOREIGN DATA WRAPPER plproxy OPTIONS (%s)', {literal(server)},
                       {literal(options)});
        EXECUTE format('CREATE USER MAPPING FOR PUBLIC SERVER %I', {literal(server)});
        RETURN;
    END IF;
    -- partitions beyond the new count are dropped, the others set or added
    FOREACH option IN ARRAY coalesce(existing, '{{}}') LOOP
        IF option ~ '^p[0-9]+=' AND substring(option FROM '^p([0-9]+)=')::int >= array_length(wanted, 1) THEN
            changes := changes || format('DROP %I', split_part(option, '=', 1));
        END IF;
    END LOOP;
    FOR i IN 1 .. array_length(wanted, 1) LOOP
        changes := changes || format('%s %I %L',
            CASE WHEN EXISTS (SELECT FROM unnest(existing) o WHERE o LIKE wanted[i][1] || '=%')
                 THEN 'SET' ELSE 'ADD' END, wanted[i][1], wanted[i][2]);
    END LOOP;
    EXECUTE format('ALTER SERVER %I OPTIONS (%s)', {literal(server)}, array_to_string(changes, ', '));
END
$do$;
COMMIT;
"""


def partition_config_sql(index: int, count: int, accepting: bool = True) -> str:
    check_partition_count(count)
    if not 0 <= index < count:
        raise SystemExit(f"partition {index} does not exist among {count}")
    return f"SELECT idem_partition.configure({index}, {count}, {'true' if accepting else 'false'});\n"


def proxy_partitions(proxy, server: str = SERVER) -> list[str]:
    row = proxy.execute("SELECT srvoptions FROM pg_foreign_server WHERE srvname = %s", [server]).fetchone()
    if row is None:
        raise SystemExit(f'the proxy has no server "{server}"')
    dsns = {}
    for option in row[0] or []:
        name, _, value = option.partition("=")
        if name.startswith("p") and name[1:].isdigit():
            dsns[int(name[1:])] = value
    return [dsns[i] for i in range(len(dsns))]


def partition_config(conn):
    return conn.execute("SELECT partition, partitions, accepting FROM idem_partition.config").fetchone()


def reshard(proxy_dsn: str, new_dsns: list[str], server: str = SERVER, lock_timeout: str = "10s",
            log=print) -> dict:
    """Double the partition count: for every old partition p, copy the keys whose scope now routes
    to p + n (n the old count) to the new partition, switch the proxy, delete them from p.

    Writes to the old partitions are frozen (EXCLUSIVE lock on idem_keys: lookups go on) from the
    copy until the switch; a call routed by the old configuration that waited for the lock, or
    that reaches an old partition later, is refused with IK900 and retried through the proxy.
    Safe to run again after a failure at any step (see docs/scale-out.md).
    """
    import psycopg

    proxy = psycopg.connect(proxy_dsn, autocommit=True)
    current = proxy_partitions(proxy, server)
    finishing = len(current) == 2 * len(new_dsns) and current[len(new_dsns):] == new_dsns
    old_dsns = current[:len(new_dsns)] if finishing else current
    n_old = len(old_dsns)
    if len(new_dsns) != n_old:
        raise SystemExit(f"doubling {n_old} partitions needs {n_old} new ones, not {len(new_dsns)}")

    old = [psycopg.connect(dsn) for dsn in old_dsns]
    new = [psycopg.connect(dsn) for dsn in new_dsns]
    try:
        return _move(proxy, old, new, old_dsns, new_dsns, finishing, server, lock_timeout, log)
    finally:
        # closing a connection in a transaction rolls it back: a failed run leaves the old
        # partitions unlocked and unchanged
        for c in [proxy] + old + new:
            c.close()


def _move(proxy, old, new, old_dsns, new_dsns, finishing, server, lock_timeout, log) -> dict:
    n_old, n_new = len(old), 2 * len(old)
    versions = {c.execute("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'").fetchone()
                for c in old + new}
    if len(versions) != 1 or None in versions:
        raise SystemExit(f"every partition needs the same idempotency version, found {sorted(map(str, versions))}")
    for c in old + new:
        c.commit()

    moved = {}
    if finishing:
        # the proxy was switched by a run that failed after it: the new partitions must be complete
        for i, c in enumerate(new):
            if partition_config(c) != (n_old + i, n_new, True):
                raise SystemExit(f"partition {n_old + i} is configured as {partition_config(c)} although the"
                                 " proxy routes to it")
            c.commit()
    else:
        # 1. the new partitions exist but accept nothing until their keys are in
        for i, c in enumerate(new):
            c.execute("SELECT idem_partition.configure(%s, %s, false)", [n_old + i, n_new])
            c.commit()
        # 2. freeze the old partitions' writes (in-flight writers finish first)
        for p, c in enumerate(old):
            c.execute(f"SET LOCAL lock_timeout = {literal(lock_timeout)}")
            c.execute("LOCK TABLE idem_keys IN EXCLUSIVE MODE")
            if partition_config(c) != (p, n_old, True):
                raise SystemExit(f"partition {p} is configured as {partition_config(c)}, expected ({p}, {n_old}, true)")
        frozen_at = time.monotonic()
        # 3. copy (a second run replaces what a failed one left)
        for p, (src, dst) in enumerate(zip(old, new)):
            q = p + n_old
            dst.execute("DELETE FROM idem_keys")
            with src.cursor().copy(
                    "COPY (SELECT * FROM idem_keys WHERE idem_partition.idem_scope_partition(scope, %s) = %s)"
                    " TO STDOUT (FORMAT binary)" % (n_new, q)) as out, \
                    dst.cursor().copy("COPY idem_keys FROM STDIN (FORMAT binary)") as into:
                for block in out:
                    into.write(block)
            moved[q] = dst.execute("SELECT count(*) FROM idem_keys").fetchone()[0]
            dst.execute("SELECT idem_partition.configure(%s, %s, true)", [q, n_new])
        for c in new:
            c.commit()
        log(f"copied {sum(moved.values())} keys to partitions {sorted(moved)}")
    # 4. switch the proxy: from its next call on, PL/Proxy routes by the new count
    if not finishing:
        proxy.execute(proxy_config_sql(old_dsns + new_dsns, server))
    # 5. the old partitions give up the moved scopes (a finishing run freezes them again first)
    deleted = {}
    for p, c in enumerate(old):
        if finishing:
            c.execute(f"SET LOCAL lock_timeout = {literal(lock_timeout)}")
            c.execute("LOCK TABLE idem_keys IN EXCLUSIVE MODE")
        c.execute("SELECT idem_partition.configure(%s, %s, true)", [p, n_new])
        deleted[p] = c.execute("DELETE FROM idem_keys WHERE idem_partition.idem_scope_partition(scope, %s) <> %s",
                               [n_new, p]).rowcount
        c.commit()
    frozen = time.monotonic() - frozen_at if not finishing else None
    log(f"deleted {sum(deleted.values())} moved keys from partitions {sorted(deleted)}"
        + (f"; writes were frozen for {frozen:.3f} s" if frozen is not None else ""))
    return {"moved": moved, "deleted": deleted, "frozen_seconds": frozen}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="idem_scaleout.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    proxy = commands.add_parser("proxy-config", help="SQL for the proxy's cluster")
    proxy.add_argument("dsns", nargs="+", metavar="DSN")
    proxy.add_argument("--server", default=SERVER)
    partition = commands.add_parser("partition-config", help="SQL for one partition")
    partition.add_argument("index", type=int)
    partition.add_argument("count", type=int)
    partition.add_argument("--not-accepting", action="store_true")
    move = commands.add_parser("reshard", help="double the partitions")
    move.add_argument("--proxy", required=True, metavar="DSN")
    move.add_argument("--server", default=SERVER)
    move.add_argument("--lock-timeout", default="10s")
    move.add_argument("new_dsns", nargs="+", metavar="NEW_DSN")
    args = parser.parse_args(argv)
    if args.command == "proxy-config":
        sys.stdout.write(proxy_config_sql(args.dsns, args.server))
    elif args.command == "partition-config":
        sys.stdout.write(partition_config_sql(args.index, args.count, not args.not_accepting))
    else:
        reshard(args.proxy, args.new_dsns, args.server, args.lock_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
