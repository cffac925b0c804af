#!/usr/bin/python3
"""Cluster configuration and resharding for idempotency keys partitioned with PL/Proxy.

    idem_scaleout.py proxy-config DSN0 DSN1 ...     SQL for the proxy: server "idempotency" with
                                                    one partition per DSN (count a power of two)
    idem_scaleout.py partition-config INDEX COUNT   SQL for partition INDEX of COUNT
    idem_scaleout.py reshard --proxy DSN [--proxy DSN ...] NEW_DSN...
                                                    double the partitions: partition p's keys whose
                                                    scope now routes to p + old count move there;
                                                    every proxy given is switched. After a failure,
                                                    the same command again finishes the move.

A failed or interrupted reshard ends with one message: what stopped it (for a lock timeout, the
sessions holding the lock), the state it left (safe to leave or not) and the command to run next;
exit status 1, or 130 after an interrupt (Ctrl-C).

The DSNs given to proxy-config are what the proxy connects with (no password: put credentials in
the user mapping); reshard's NEW_DSNs become every proxy's connection strings as written. The
resharding tool connects to each proxy and, with the first proxy's connection strings and the
NEW_DSNs, to every partition, as the role and password of its own libpq environment (PGUSER,
PGPASSWORD, ~/.pgpass). Its privileges are listed in docs/scale-out.md.
"""

import argparse
import hashlib
import itertools
import os
import random
import shlex
import signal
import subprocess
import sys
import threading
import time

SERVER = "idempotency"


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def check_partition_count(count: int) -> None:
    if count < 1 or count & (count - 1):
        raise SystemExit(f"the partition count must be a power of two, not {count}")


def proxy_config_sql(dsns: list[str], server: str = SERVER) -> str:
    """One transaction that creates the PL/Proxy server (with a user mapping for PUBLIC and USAGE
    granted to PUBLIC) or replaces its partitions.

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
        -- PL/Proxy checks the caller's USAGE on the server
        EXECUTE format('GRANT USAGE ON FOREIGN SERVER %I TO PUBLIC', {literal(server)});
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


class ReshardError(Exception):
    """A check failed: the message says what and that nothing was changed, or what to run."""


def masked(dsn: str) -> str:
    """A connection string fit for a message: its password, if any, replaced."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    try:
        params = conninfo_to_dict(dsn)
    except Exception:
        return "<a connection string that does not parse>"
    if "password" not in params:
        return dsn
    params["password"] = "***"
    return make_conninfo(**params)


def proxy_partitions(proxy, server: str = SERVER) -> list[str]:
    row = proxy.execute("SELECT srvoptions FROM pg_foreign_server WHERE srvname = %s", [server]).fetchone()
    if row is None:
        raise ReshardError(f'the proxy has no server "{server}"')
    dsns = {}
    for option in row[0] or []:
        name, _, value = option.partition("=")
        if name.startswith("p") and name[1:].isdigit():
            dsns[int(name[1:])] = value
    return [dsns[i] for i in range(len(dsns))]


def partition_config(conn):
    return conn.execute("SELECT partition, partitions, accepting FROM idem_partition.config").fetchone()


# Test hooks: the tool stops with an error, or is sent SIGINT by itself (as Ctrl-C would), right
# after the named step (tests/test_reshard_repair.py).
FAIL_AFTER = "IDEMPOTENCY_SCALEOUT_FAIL_AFTER"
INTERRUPT_AFTER = "IDEMPOTENCY_SCALEOUT_INTERRUPT_AFTER"
STEPS = ("prepared", "copied", "gave-up-first", "gave-up", "accepting", "switched-first", "switched")


def step_done(step: str, log) -> None:
    log(f"step done: {step}")
    if os.environ.get(FAIL_AFTER) == step:
        raise RuntimeError(f"failure injected after step {step} ({FAIL_AFTER})")
    if os.environ.get(INTERRUPT_AFTER) == step:
        os.kill(os.getpid(), signal.SIGINT)


class HookFailed(Exception):
    """The --hook exited non-zero."""


class Stopped(Exception):
    """A resharding that stopped, in one message: what stopped it, the state it left, what to run."""

    def __init__(self, what: str, state: str, next_step: str, interrupted: bool):
        self.what, self.state, self.next_step, self.interrupted = what, state, next_step, interrupted
        super().__init__(f"{what}\n{state}\n{next_step}")


class Progress:
    """Where a resharding is, for the message that ends a failed or interrupted run."""

    def __init__(self):
        self.doing = "step 0, the checks"
        self.checked = False                  # what earlier runs left is known (step 0 passed)
        self.db: "Database | None" = None     # the database being worked on, if any
        self.changed = False                  # a NEW partition was configured (step 1)
        self.given_up: list[int] = []         # old partitions whose step 4 committed
        self.switched = False                 # every proxy routes by 2N
        self.hook = False                     # a --hook has a cleanup phase to run after step 6

    def at(self, doing: str, db: "Database | None" = None) -> None:
        self.doing, self.db = doing, db


# the modes that conflict with LOCK ... IN EXCLUSIVE MODE (step 2) and the updates of steps 4 and 5
CONFLICTING = ("RowShareLock", "RowExclusiveLock", "ShareUpdateExclusiveLock", "ShareLock",
               "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock")


def lock_holders(db: "Database") -> list[str]:
    """The other sessions holding a lock on idem_keys or idem_partition.config of db that the
    tool's locks wait for (never their query text: it may hold a request's body)."""
    db.conn.rollback()
    rows = db.conn.execute(
        "SELECT l.pid, a.application_name, a.usename, a.state, a.xact_start, a.query_start,"
        "  string_agg(DISTINCT l.relation::regclass::text || ' ' || l.mode, ', ')"
        " FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()"
        "   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        "   AND l.relation IN (to_regclass('idem_keys'), to_regclass('idem_partition.config'))"
        "   AND l.mode = ANY (%s)"
        " GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY a.xact_start NULLS LAST, l.pid", [list(CONFLICTING)]).fetchall()
    db.conn.rollback()
    held = []
    for pid, application, user, state, xact_start, query_start, locks in rows:
        since = (f", in a transaction since {xact_start:%Y-%m-%d %H:%M:%S %Z}" if xact_start
                 else ", transaction start not visible to this role (pg_read_all_stats)")
        last = f", last query started {query_start:%Y-%m-%d %H:%M:%S %Z}" if query_start else ""
        held.append(f"pid {pid} (application_name {application or '-'!s}, user {user or '-'!s},"
                    f" {state or 'state unknown'}{since}{last}) holds {locks}")
    return held


def stopped(progress: Progress, error: BaseException, n: int, lock_timeout: str) -> Stopped:
    """The message for a resharding stopped by error (or an interrupt) at progress."""
    import psycopg
    interrupted = isinstance(error, KeyboardInterrupt)
    where = f" on {progress.db.role} ({masked(progress.db.dsn)})" if progress.db else ""
    if interrupted:
        what = f"reshard interrupted during {progress.doing}{where}"
    elif isinstance(error, psycopg.errors.LockNotAvailable) and progress.db is not None:
        try:
            holders = lock_holders(progress.db)
        except Exception as e:     # the session is gone too: say what is known
            holders = [f"(the sessions could not be listed: {str(e).strip()})"]
        what = (f"reshard stopped during {progress.doing}{where}: its lock did not come within"
                f" --lock-timeout {lock_timeout}; " + ("held by:\n  " + "\n  ".join(holders) if holders else
                "the sessions that held it have ended since"))
    else:
        text = str(error).strip() or type(error).__name__
        what = f"reshard stopped during {progress.doing}{where}: {text}"
    fix = ("run the same command again" if interrupted
           else "once the hook is fixed, run the same command again" if isinstance(error, HookFailed)
           else "once those sessions are done (or with a longer --lock-timeout), run the same command again"
           if isinstance(error, psycopg.errors.LockNotAvailable)
           else "once that is fixed, run the same command again")
    if not progress.checked:
        state = "Safe: this run changed nothing (what an earlier run left, if anything, is as it was)."
        next_step = f"Next: {fix}."
    elif not progress.changed:
        state = "Safe: nothing was changed."
        next_step = f"Next: {fix} to reshard."
    elif not progress.given_up:
        state = ("Safe to leave: the old partitions serve every scope as before; the NEW partitions are"
                 " configured not accepting, and whatever was copied to them is routed to by nobody.")
        next_step = f"Next: {fix}; it finishes this resharding (nothing else may use the NEW databases meanwhile)."
    elif not progress.switched:
        gave = ", ".join(f"{p} (to {p + n})" for p in progress.given_up)
        state = (f"NOT safe to leave: OLD partitions {gave} gave their moved scopes up; calls for those"
                 " scopes get IK900 (retryable) through every proxy not yet switched until the resharding"
                 " finishes. No scope has two accepting partitions.")
        next_step = f"Next: {fix}, now: it finishes this resharding."
    elif progress.hook:
        state = (f"Safe to leave: the keys are moved and every proxy routes by {2 * n} partitions; the hook's"
                 " cleanup phase did not finish (old partitions may still hold rows of moved scopes in"
                 " the application's tables).")
        next_step = f"Next: {fix}; it only runs the cleanup phase again."
    else:
        state = f"Safe: the resharding is done; every proxy routes by {2 * n} partitions."
        next_step = "Next: nothing (the same command again checks that and changes nothing)."
    return Stopped(what, state, next_step, interrupted)


class Database:
    """A connection to one database, and what identifies that database whatever DSN reached it:
    the cluster's system identifier and the database's oid."""

    def __init__(self, role: str, dsn: str):
        import psycopg
        self.role, self.dsn = role, dsn
        try:
            self.conn = psycopg.connect(dsn)
        except psycopg.Error as e:
            raise ReshardError(f"{role} ({masked(dsn)}) cannot be reached: {str(e).strip()}; nothing was changed")
        self.identity = self.conn.execute(
            "SELECT (SELECT system_identifier FROM pg_control_system()), d.oid, d.datname"
            " FROM pg_database d WHERE d.datname = current_database()").fetchone()
        self.conn.commit()

    def same_as(self, other: "Database") -> bool:
        """The same database: the same system identifier and database oid, and an advisory lock
        taken through one connection holds against the other (clones of one cluster, made from a
        base backup, share the identifier and the oids but not their locks)."""
        if self.identity[:2] != other.identity[:2]:
            return False
        key = random.getrandbits(62)
        if not self.conn.execute("SELECT pg_try_advisory_lock(%s)", [key]).fetchone()[0]:
            raise ReshardError(f"{self.role}: could not take a fresh advisory lock; nothing was changed")
        try:
            free = other.conn.execute("SELECT pg_try_advisory_lock(%s)", [key]).fetchone()[0]
            if free:
                other.conn.execute("SELECT pg_advisory_unlock(%s)", [key])
            return not free
        finally:
            self.conn.execute("SELECT pg_advisory_unlock(%s)", [key])

    def describe(self) -> str:
        system, oid, name = self.identity
        return f"database {name} (oid {oid}) of the cluster with system identifier {system}"

    def close(self) -> None:
        # closing a connection in a transaction rolls it back: nothing half-done stays locked
        self.conn.close()


def reshard(proxy_dsns, new_dsns: list[str], server: str = SERVER, lock_timeout: str = "10s",
            log=print, hook: str | None = None) -> dict:
    """Double the partition count from N to 2N: old partition p keeps the scopes with
    hash & (2N - 1) = p and gives those of p + N to the new partition p + N; every proxy is
    switched to the 2N partitions. See docs/scale-out.md for the steps.

    `hook`, a shell command, moves the application's own tables colocated by scope: it runs for
    each pair (old p, new p + N) with IDEM_RESHARD_PHASE=copy while the old partition's writes are
    frozen, after its keys are copied and before it gives the scopes up (it must replace what an
    earlier run copied), then with IDEM_RESHARD_PHASE=cleanup once every proxy is switched (it
    must be idempotent). A non-zero exit stops the tool like any other failure.

    Everything is checked before anything changes. A run that fails leaves a state that the same
    command, run again, finishes; at every point each scope has at most one accepting partition.
    """
    if isinstance(proxy_dsns, str):
        proxy_dsns = [proxy_dsns]
    new_dsns = list(new_dsns)
    opened: list[Database] = []
    interrupts = None
    progress = Progress()
    progress.hook = bool(hook)

    def open_db(role, dsn):
        db = Database(role, dsn)
        opened.append(db)
        return db

    try:
        proxies = [open_db(f"proxy {i + 1}", dsn) for i, dsn in enumerate(proxy_dsns)]
        for db in proxies:
            db.conn.autocommit = True
        n = len(new_dsns)
        check_partition_count(n)
        lists = [proxy_partitions(db.conn, server) for db in proxies]
        first = lists[0]
        if len(first) not in (n, 2 * n):
            raise ReshardError(f"proxy 1 routes to {len(first)} partitions: doubling to {2 * n} needs"
                               f" {len(first)} NEW_DSNs, not {n}; nothing was changed")
        old = [open_db(f"OLD partition {p}", dsn) for p, dsn in enumerate(first[:n])]
        new = [open_db(f"NEW partition {n + i}", dsn) for i, dsn in enumerate(new_dsns)]
        plan = _check(proxies, lists, old, new, server, log)
        if plan["order"] != list(range(n)):
            new_dsns = [new_dsns[i] for i in plan["order"]]
        progress.checked = True
        progress.changed = plan["prepared"]
        progress.given_up = [p for p in range(n) if p not in plan["to_copy"]]
        progress.switched = not plan["to_copy"] and not plan["to_accept"] and all(len(d) == 2 * n for d in lists)
        return _move(plan, proxies, lists, old, new, new_dsns, server, lock_timeout, log, hook, progress)
    except (Exception, KeyboardInterrupt, SystemExit) as error:
        # a second Ctrl-C must not cut the message short (nor the closing of the connections)
        if threading.current_thread() is threading.main_thread():
            interrupts = signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise stopped(progress, error, len(new_dsns), lock_timeout) from error
    finally:
        for db in opened:
            db.close()
        if interrupts is not None:
            signal.signal(signal.SIGINT, interrupts)


def resharding_identity(old, new) -> str:
    """A resharding's identity: a hash of its old and new databases' identities, in order."""
    return hashlib.sha256(repr(["idempotency resharding", [d.identity[:2] for d in old],
                                [d.identity[:2] for d in new]]).encode()).hexdigest()[:16]


def _recorded_order(old, new) -> list[int]:
    """The order of the NEW databases as the resharding that prepared them recorded it: the
    positions of the given list, in that order. A repair given the same NEW databases in another
    order is the same resharding (each prepared one records its partition number; the blank ones
    take the remaining places, in whichever order gives the recorded identity). Anything else keeps
    the given order, and the checks then decide."""
    n = len(old)
    given = list(range(n))
    rows = [db.conn.execute("SELECT partition, partitions, resharding FROM idem_partition.config").fetchone()
            for db in new]
    for db in new:
        db.conn.commit()
    placed, recorded = {}, set()
    for i, row in enumerate(rows):
        if row is None:
            continue
        partition, partitions, resharding = row
        if partitions != 2 * n or resharding is None or not n <= partition < 2 * n or partition - n in placed:
            return given
        placed[partition - n] = i
        recorded.add(resharding)
    if len(recorded) != 1:
        return given
    (target,) = recorded
    free = [slot for slot in range(n) if slot not in placed]
    blanks = [i for i, row in enumerate(rows) if row is None]
    # a failure in step 1 may leave several blank: try their orders (bounded, they are few)
    for arrangement in itertools.islice(itertools.permutations(blanks), 40320):
        order = [0] * n
        for slot, i in placed.items():
            order[slot] = i
        for slot, i in zip(free, arrangement):
            order[slot] = i
        if resharding_identity(old, [new[i] for i in order]) == target:
            return order
    return given


def _check(proxies, lists, old, new, server, log=print) -> dict:
    """Every check, before any change. Returns what is left to do (a first run, or the repair of
    a failed one: its leftovers are recognised by the resharding's identity), and the order of the
    NEW databases (`new` is put in that order)."""
    n = len(old)
    databases = old + new
    for i, db in enumerate(databases):
        for other in databases[:i]:
            if db.same_as(other):
                raise ReshardError(f"{db.role} ({masked(db.dsn)}) is the same {db.describe()} as {other.role}:"
                                   " every NEW_DSN must name an empty database of its own, prepared with"
                                   " partition.sql and not configured; nothing was changed")
    _check_partitions(old, new)
    order = _recorded_order(old, new)
    if order != list(range(n)):
        new[:] = [new[i] for i in order]
        for i, db in enumerate(new):
            db.role = f"NEW partition {n + i}"
        log("the NEW databases were given in another order than the resharding that prepared them:"
            f" taken in its order, {[masked(db.dsn) for db in new]}")
    identity = resharding_identity(old, new)

    # every proxy: reachable (opened above), allowed to ALTER SERVER, routing to the same databases
    for db, dsns in zip(proxies, lists):
        owner = db.conn.execute("SELECT pg_has_role(srvowner, 'USAGE') FROM pg_foreign_server WHERE srvname = %s",
                                [server]).fetchone()[0]
        if not owner:
            raise ReshardError(f'{db.role} ({masked(db.dsn)}): this role does not own server "{server}" there'
                               " and cannot switch it (ALTER SERVER); nothing was changed")
        if len(dsns) not in (n, 2 * n):
            raise ReshardError(f"{db.role} routes to {len(dsns)} partitions, not {n} or {2 * n}; nothing was changed")
        for i, dsn in enumerate(dsns):
            expected = (old + new)[i]
            if db is proxies[0] and i < n:
                continue
            probe = Database(f"partition {i} of {db.role}", dsn)
            try:
                if not probe.same_as(expected):
                    raise ReshardError(f"{db.role} routes partition {i} to {probe.describe()}, not to the"
                                       f" {expected.describe()} of {expected.role}; nothing was changed")
            finally:
                probe.close()

    # the state of each pair (old p, new p + N): not started, or left by a run of this resharding
    to_copy, to_accept, prepared = [], [], False
    for p, (o, w) in enumerate(zip(old, new)):
        q = p + n
        o_config = partition_config(o.conn)
        w_row = w.conn.execute("SELECT partition, partitions, accepting, resharding FROM idem_partition.config"
                               ).fetchone()
        w_keys = w.conn.execute("SELECT count(*) FROM idem_keys").fetchone()[0]
        ours = w_row is not None and w_row[3] == identity and w_row[:2] == (q, 2 * n)
        if w_row is None and w_keys:
            raise ReshardError(f"{w.role} ({masked(w.dsn)}) is not new: it holds {w_keys} keys; nothing was changed")
        prepared = prepared or ours
        if w_row is not None and not ours:
            how = (f"configured as partition {w_row[0]} of {w_row[1]}" if w_row[3] is None
                   else f"prepared by another resharding ({w_row[3]})")
            raise ReshardError(f"{w.role} ({masked(w.dsn)}) is not new: it is {how}; nothing was changed")
        if o_config == (p, n, True):
            if ours and w_row[2]:
                raise ReshardError(f"{w.role} accepts calls although {o.role} still owns its scopes;"
                                   " nothing was changed")
            to_copy.append(p)
        elif o_config == (p, 2 * n, True):
            if not ours:
                raise ReshardError(f"{o.role} is configured as partition {p} of {2 * n} but {w.role} was not"
                                   " prepared by this resharding; nothing was changed")
            if not w_row[2]:
                to_accept.append(p)
        else:
            raise ReshardError(f"{o.role} is configured as {o_config}, expected ({p}, {n}, true) or"
                               f" ({p}, {2 * n}, true); nothing was changed")
        w.conn.commit()
        o.conn.commit()
    return {"identity": identity, "to_copy": to_copy, "to_accept": to_accept, "order": order,
            "prepared": prepared}


def _check_partitions(old, new) -> None:
    """Each partition: the extension, schema idem_partition of this version, the privileges."""
    versions = set()
    for db in old + new:
        has = db.conn.execute(
            "SELECT (SELECT extversion FROM pg_extension WHERE extname = 'idempotency'),"
            " to_regclass('idem_partition.config') IS NOT NULL,"
            " CASE WHEN to_regclass('idem_partition.config') IS NOT NULL AND to_regclass('idem_keys') IS NOT NULL"
            "  THEN has_table_privilege('idem_keys', 'SELECT') AND has_table_privilege('idem_keys', 'INSERT')"
            "   AND has_table_privilege('idem_keys', 'DELETE')"
            "   AND has_table_privilege('idem_partition.config', 'INSERT')"
            "   AND has_table_privilege('idem_partition.config', 'UPDATE') END").fetchone()
        if has[0] is None or not has[1]:
            raise ReshardError(f"{db.role} ({masked(db.dsn)}) has no idempotency extension or no schema"
                               " idem_partition (scale-out/sql/partition.sql); nothing was changed")
        if not has[2]:
            raise ReshardError(f"{db.role}: this role needs SELECT, INSERT and DELETE on idem_keys and"
                               " INSERT and UPDATE on idem_partition.config; nothing was changed")
        versions.add(has[0])
    if len(versions) != 1:
        raise ReshardError(f"every partition needs the same idempotency version, found {sorted(versions)};"
                           " nothing was changed")
    for db in new:
        if db.conn.execute("SELECT NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid ="
                           " 'idem_partition.config'::regclass AND attname = 'resharding')").fetchone()[0]:
            raise ReshardError(f"{db.role} ({masked(db.dsn)}) has an older idem_partition schema: create it"
                               " with this version of scale-out/sql/partition.sql; nothing was changed")
    for db in old + new:
        if not db.conn.execute("SELECT has_function_privilege(to_regproc('idem_partition.configure'), 'EXECUTE')"
                               ).fetchone()[0]:
            raise ReshardError(f"{db.role}: this role needs EXECUTE on idem_partition.configure;"
                               " nothing was changed")


def run_hook(hook, phase, p, n, old_dsn, new_dsn, log) -> None:
    env = dict(os.environ, IDEM_RESHARD_PHASE=phase, IDEM_OLD_PARTITION=str(p), IDEM_NEW_PARTITION=str(p + n),
               IDEM_PARTITIONS=str(2 * n), IDEM_OLD_DSN=old_dsn, IDEM_NEW_DSN=new_dsn)
    done = subprocess.run(hook, shell=True, env=env)
    if done.returncode != 0:
        raise HookFailed(f"the hook failed in phase {phase} for partitions {p} and {p + n} (exit status"
                         f" {done.returncode})")
    log(f"hook: {phase} for partitions {p} and {p + n}")


def _move(plan, proxies, lists, old, new, new_dsns, server, lock_timeout, log, hook, progress) -> dict:
    n = len(old)
    identity, to_copy = plan["identity"], plan["to_copy"]
    log(f"resharding {identity}: {n} -> {2 * n} partitions; to copy: {[p + n for p in to_copy]}")
    # 1. the new partitions that are still blank: configured, not accepting, marked as this resharding's
    for p in to_copy:
        progress.at("step 1, preparing the NEW partitions", new[p])
        new[p].conn.execute("SELECT idem_partition.configure(%s, %s, false, %s)", [p + n, 2 * n, identity])
        new[p].conn.commit()
        progress.changed = True
    step_done("prepared", log)

    # 2. freeze the old partitions' writes (in-flight writers finish first; lookups go on)
    moved, deleted, frozen_at = {}, {}, None
    for p in to_copy:
        c = old[p].conn
        progress.at("step 2, freezing the writes of the old partitions", old[p])
        c.execute(f"SET LOCAL lock_timeout = {literal(lock_timeout)}")
        c.execute("LOCK TABLE idem_keys IN EXCLUSIVE MODE")
        if partition_config(c) != (p, n, True):
            raise ReshardError(f"{old[p].role} changed while it was checked: {partition_config(c)};"
                               " run the same command again")
    frozen_at = time.monotonic()
    # 3. copy into each new partition, in one transaction there, still not accepting: what a failed
    # run left is replaced (the partition is this resharding's, checked above)
    for p in to_copy:
        src, dst = old[p].conn, new[p].conn
        progress.at(f"step 3, copying the keys of OLD partition {p} to NEW partition {p + n}", new[p])
        dst.execute("SELECT FROM idem_partition.config WHERE resharding = %s FOR UPDATE", [identity])
        dst.execute("DELETE FROM idem_keys")
        with src.cursor().copy(
                "COPY (SELECT * FROM idem_keys WHERE idem_partition.idem_scope_partition(scope, %s) = %s)"
                " TO STDOUT (FORMAT binary)" % (2 * n, p + n)) as out, \
                dst.cursor().copy("COPY idem_keys FROM STDIN (FORMAT binary)") as into:
            for block in out:
                into.write(block)
        moved[p + n] = dst.execute("SELECT count(*) FROM idem_keys").fetchone()[0]
        dst.commit()
        if hook:
            progress.at(f"step 3, the hook's copy phase for partitions {p} and {p + n}")
            run_hook(hook, "copy", p, n, lists[0][p], new_dsns[p], log)
    if to_copy:
        log(f"copied {sum(moved.values())} keys to partitions {sorted(moved)}")
    step_done("copied", log)
    # 4. each old partition gives up the moved scopes: from its commit on it refuses them (IK900),
    # and nothing accepts them until step 5: never two owners, whatever fails in between
    for i, p in enumerate(to_copy):
        c = old[p].conn
        progress.at("step 4, the old partitions giving up their moved scopes", old[p])
        c.execute("SELECT idem_partition.configure(%s, %s, true)", [p, 2 * n])
        deleted[p] = c.execute("DELETE FROM idem_keys WHERE idem_partition.idem_scope_partition(scope, %s) <> %s",
                               [2 * n, p]).rowcount
        c.commit()
        progress.given_up.append(p)
        if i == 0:
            step_done("gave-up-first", log)
    frozen = time.monotonic() - frozen_at if to_copy else None
    if to_copy:
        log(f"deleted {sum(deleted.values())} moved keys from partitions {sorted(deleted)};"
            f" writes were frozen for {frozen:.3f} s")
    step_done("gave-up", log)
    # 5. the new partitions accept their scopes
    for p in sorted(set(to_copy) | set(plan["to_accept"])):
        progress.at("step 5, the NEW partitions accepting", new[p])
        new[p].conn.execute("SELECT idem_partition.configure(%s, %s, true, %s)", [p + n, 2 * n, identity])
        new[p].conn.commit()
    step_done("accepting", log)
    # 6. every proxy routes by 2N from its next call (until then the moved scopes answer IK900)
    for i, (db, dsns) in enumerate(zip(proxies, lists)):
        if len(dsns) == n:
            progress.at("step 6, switching the proxies", db)
            db.conn.execute(proxy_config_sql(dsns + new_dsns, server))
            log(f"{db.role} switched to {2 * n} partitions")
        if i == 0:
            step_done("switched-first", log)
    progress.switched = True
    progress.at("step 6, switching the proxies")
    step_done("switched", log)
    # 7. the application's tables: the old partitions' copies of moved scopes are dropped
    if hook:
        for p in range(n):
            progress.at(f"step 7, the hook's cleanup phase for partitions {p} and {p + n}")
            run_hook(hook, "cleanup", p, n, lists[0][p], new_dsns[p], log)
    return {"moved": moved, "deleted": deleted, "frozen_seconds": frozen, "resharding": identity}


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
    move.add_argument("--proxy", required=True, action="append", metavar="DSN",
                      help="a proxy to switch; repeat it for every proxy")
    move.add_argument("--server", default=SERVER)
    move.add_argument("--lock-timeout", default="10s")
    move.add_argument("--hook", metavar="COMMAND",
                      help="moves the application's tables colocated by scope (docs/scale-out.md)")
    move.add_argument("new_dsns", nargs="+", metavar="NEW_DSN")
    args = parser.parse_args(argv)
    if args.command == "proxy-config":
        sys.stdout.write(proxy_config_sql(args.dsns, args.server))
    elif args.command == "partition-config":
        sys.stdout.write(partition_config_sql(args.index, args.count, not args.not_accepting))
    else:
        try:
            reshard(args.proxy, args.new_dsns, args.server, args.lock_timeout, hook=args.hook)
        except Stopped as stop:
            command = ["idem_scaleout.py", "reshard"]
            for dsn in args.proxy:
                command += ["--proxy", masked(dsn)]
            if args.server != SERVER:
                command += ["--server", args.server]
            command += ["--lock-timeout", args.lock_timeout] if args.lock_timeout != "10s" else []
            command += ["--hook", args.hook] if args.hook else []
            command += [masked(dsn) for dsn in args.new_dsns]
            print(f"{stop}\n  {shlex.join(command)}", file=sys.stderr)
            return 130 if stop.interrupted else 1
        except KeyboardInterrupt:
            # before the resharding began, or a second Ctrl-C while it was ending
            print("reshard interrupted; run the same command again: it checks what is left and finishes it",
                  file=sys.stderr)
            return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
