"""The resharding tool as an operator runs it (the command line), against two proxies: it refuses,
changing nothing, whatever is wrong with its arguments or the databases they name; a run that
fails after any of its steps leaves no scope with two accepting partitions, and the same command
run again (the repair) leaves a serving cluster of 4 partitions with every key once, unchanged."""

import os
import shlex
import signal
import subprocess
import sys

import psycopg
import pytest

from guide import guide_blocks
from pgcluster import BINDIR, HERE
from test_reshard import all_rows

import idem_scaleout

SCOPES = [f"r-{i}" for i in range(48)]
TOOL = HERE / "idem_scaleout.py"


def run_tool(proxies, new_dsns, fail_after=None, hook=None, interrupt_after=None, options=()):
    env = dict(os.environ, PATH=f"{BINDIR}:{os.environ['PATH']}")    # the hook's psql
    env.pop(idem_scaleout.FAIL_AFTER, None)
    env.pop(idem_scaleout.INTERRUPT_AFTER, None)
    if fail_after:
        env[idem_scaleout.FAIL_AFTER] = fail_after
    if interrupt_after:
        env[idem_scaleout.INTERRUPT_AFTER] = interrupt_after
    args = [sys.executable, str(TOOL), "reshard", *options]
    for proxy in proxies:
        args += ["--proxy", proxy]
    if hook:
        args += ["--hook", hook]
    # Ctrl-C as at a terminal: a shell's background job (a CI started with `&`) ignores SIGINT,
    # and the tool, which keeps an ignored SIGINT ignored, would never see the tests' interrupts.
    result = subprocess.run(args + list(new_dsns), capture_output=True, text=True, env=env, timeout=300,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert "Traceback" not in result.stderr, result.stderr      # every ending is a message
    return result


def assert_ends_with_next_command(result, proxies, new_dsns):
    """The message's last line is the command to run next: the same one, as given."""
    last = result.stderr.rstrip().splitlines()[-1].strip()
    assert last.startswith("idem_scaleout.py reshard "), result.stderr
    assert all(f"--proxy {shlex.quote(proxy)}" in last for proxy in proxies), result.stderr
    assert last.endswith(" ".join(shlex.quote(dsn) for dsn in new_dsns)), result.stderr


def fill(d):
    with d.proxy.connect() as px:
        for s in SCOPES:
            px.execute("SELECT idem_claim('done', scope => %s)", [s])
            px.execute("SELECT idem_complete('done', '{\"n\": 1}', scope => %s)", [s])
            px.execute("SELECT idem_claim('live', scope => %s, lease => '1 hour')", [s])


def configs(d):
    return [tuple(p.query("SELECT partition, partitions, accepting FROM idem_partition.config")[0])
            if p.query("SELECT count(*) FROM idem_partition.config")[0][0] else None for p in d.partitions]


def proxy_options(d):
    return [px.query("SELECT srvoptions FROM pg_foreign_server WHERE srvname = 'idempotency'")[0][0]
            for px in d.proxies]


def accepting_owners(d, scopes):
    """For each scope, the partitions that would accept a call for it under their own configuration."""
    owners = {s: [] for s in scopes}
    with d.proxy.connect() as px:
        for i, c in enumerate(configs(d)):
            if c is None or not c[2]:
                continue
            for s in scopes:
                if px.execute("SELECT idem_partition.idem_scope_partition(%s, %s)", [s, c[1]]).fetchone()[0] == c[0]:
                    owners[s].append(i)
    return owners


def answers(d):
    """Through every proxy, every scope: its finished key replays and its live lease is in progress,
    or the call is refused with IK900 (the scope is between two partitions). Returns the scopes
    refused."""
    refused = set()
    for proxy in d.proxies:
        with proxy.connect() as px:
            for s in SCOPES:
                try:
                    done = px.execute("SELECT outcome FROM idem_claim('done', scope => %s)", [s]).fetchone()
                    live = px.execute("SELECT outcome FROM idem_claim('live', scope => %s)", [s]).fetchone()
                except psycopg.Error as e:
                    assert e.sqlstate == "IK900", str(e)
                    refused.add(s)
                    continue
                assert (done, live) == (("replay",), ("in_progress",)), (s, done, live)
    return refused


# --- refused: nothing changes -------------------------------------------------------------------

def respelled(dsn):
    """The same database named by another connection string (what a comparison of text misses)."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    return " ".join(f"{k}={v}" for k, v in reversed(list(params.items())))


def refusal_cases(d):
    old = [p.dsn for p in d.partitions[:2]]
    new = [p.dsn for p in d.partitions[2:]]
    proxies = [px.dsn for px in d.proxies]
    return {
        "the live partitions given as NEW": (proxies, old, "is the same database"),
        "one live partition spelled differently": (proxies, [new[0], respelled(old[1])], "is the same database"),
        "one NEW database twice": (proxies, [new[0], respelled(new[0])], "is the same database"),
        "a proxy that cannot be reached": (proxies + [d.proxies[0].dsn.replace(str(d.proxies[0].port), "1")],
                                           new, "cannot be reached"),
    }


@pytest.mark.parametrize("case", ["the live partitions given as NEW", "one live partition spelled differently",
                                  "one NEW database twice", "a proxy that cannot be reached"])
def test_a_refused_reshard_changes_nothing(two_plus_two_checks, case):
    d = two_plus_two_checks
    if not d.partitions[0].query("SELECT count(*) FROM idem_keys")[0][0]:
        fill(d)
    proxies, new, reason = refusal_cases(d)[case]
    before = (all_rows(d.partitions), configs(d), proxy_options(d))
    result = run_tool(proxies, new)
    assert result.returncode != 0, result.stdout
    assert reason in result.stderr and "nothing was changed" in result.stderr, result.stderr
    assert (all_rows(d.partitions), configs(d), proxy_options(d)) == before
    assert answers(d) == set()        # the old partitions serve exactly as before


@pytest.mark.parametrize("how, sql", [
    ("it holds keys", "SELECT idem_claim('someone-else', scope => 'x')"),
    ("it is configured", "SELECT idem_partition.configure(0, 1)"),
])
def test_a_new_database_that_is_not_new_is_refused_and_kept(two_plus_two_checks, how, sql):
    d = two_plus_two_checks
    if not d.partitions[0].query("SELECT count(*) FROM idem_keys")[0][0]:
        fill(d)
    spare = d.partitions[3]
    spare.psql_script("idem", sql)
    try:
        before = (all_rows(d.partitions), configs(d), proxy_options(d))
        result = run_tool([px.dsn for px in d.proxies], [p.dsn for p in d.partitions[2:]])
        assert result.returncode != 0, result.stdout
        assert "NEW partition 3" in result.stderr and "is not new" in result.stderr, result.stderr
        assert (all_rows(d.partitions), configs(d), proxy_options(d)) == before   # its keys are still there
        assert answers(d) == set()
    finally:
        spare.psql_script("idem", "DELETE FROM idem_keys; DELETE FROM idem_partition.config")


# --- a failure after each step, then the repair ----------------------------------------------------

@pytest.mark.parametrize("step", idem_scaleout.STEPS)
def test_a_failure_after_each_step_then_the_same_command_repairs_it(fresh_two_plus_two, step):
    d = fresh_two_plus_two
    fill(d)
    before = all_rows(d.partitions)
    old_options = proxy_options(d)
    new = [p.dsn for p in d.partitions[2:]]
    proxies = [px.dsn for px in d.proxies]

    failed = run_tool(proxies, new, fail_after=step)
    assert failed.returncode == 1 and f"failure injected after step {step}" in failed.stderr, failed.stderr
    safe = "NOT safe to leave" not in failed.stderr
    assert safe == (step in ("prepared", "copied", "switched")), failed.stderr
    assert_ends_with_next_command(failed, proxies, new)

    # whatever the step: no scope has two accepting partitions, and none is answered wrongly
    assert all(len(o) <= 1 for o in accepting_owners(d, SCOPES).values())
    refused = answers(d)
    if step in ("prepared", "copied"):
        # before any old partition gave anything up: the old partitions serve exactly as before
        assert configs(d)[:2] == [(0, 2, True), (1, 2, True)] and refused == set()
        assert proxy_options(d) == old_options
        assert {k: v for k, v in all_rows(d.partitions[:2]).items()} == before

    # the repair: the same command (the NEW databases may be spelled differently: they are
    # recognised by what they are, and every proxy gets the strings of this run)
    new_spelling = [respelled(dsn) for dsn in new]
    repaired = run_tool(proxies, new_spelling)
    assert repaired.returncode == 0, repaired.stderr
    assert configs(d) == [(i, 4, True) for i in range(4)]
    for options in proxy_options(d):
        assert len(options) == 4 and options[2:] in (
            [f"p2={new[0]}", f"p3={new[1]}"], [f"p2={new_spelling[0]}", f"p3={new_spelling[1]}"]), options
    after = all_rows(d.partitions)
    assert set(after) == set(before)
    with d.proxy.connect() as px:
        for (scope, key), copies in after.items():
            where = px.execute("SELECT idem_partition.idem_scope_partition(%s, 4)", [scope]).fetchone()[0]
            assert [i for i, _ in copies] == [where], (scope, key, [i for i, _ in copies])
            assert copies[0][1] == before[(scope, key)][0][1]
    assert answers(d) == set()
    # and once more: nothing left to do, nothing changes
    again = run_tool(proxies, new_spelling)
    assert again.returncode == 0, again.stderr
    assert all_rows(d.partitions) == after


# --- the application's tables, moved by the hook ----------------------------------------------------

@pytest.mark.parametrize("fail_after", [None, "gave-up-first"])
def test_the_hook_moves_the_application_tables(fresh_two_plus_two, fail_after, tmp_path):
    d = fresh_two_plus_two
    fill(d)
    for p in d.partitions:
        p.psql_script("idem", "CREATE TABLE orders (scope text, id int, total int)")
    with d.proxy.connect() as px:
        owner2 = {s: px.execute("SELECT idem_partition.idem_scope_partition(%s, 2)", [s]).fetchone()[0]
                  for s in SCOPES}
        owner4 = {s: px.execute("SELECT idem_partition.idem_scope_partition(%s, 4)", [s]).fetchone()[0]
                  for s in SCOPES}
    for s in SCOPES:
        with d.partitions[owner2[s]].connect() as conn:
            conn.execute("INSERT INTO orders SELECT %s, i, 10 * i FROM generate_series(1, 3) i", [s])
    hook = tmp_path / "move-orders"           # the guide's hook, as written
    hook.write_text(guide_blocks()["hook"])
    hook.chmod(0o755)
    proxies, new = [px.dsn for px in d.proxies], [p.dsn for p in d.partitions[2:]]
    if fail_after:
        failed = run_tool(proxies, new, fail_after=fail_after, hook=str(hook))
        assert failed.returncode != 0 and "failure injected" in failed.stderr, failed.stderr
    done = run_tool(proxies, new, hook=str(hook))
    assert done.returncode == 0, done.stderr
    assert "hook: cleanup for partitions 1 and 3" in done.stdout, done.stdout
    where = {}
    for i, p in enumerate(d.partitions):
        for scope, order_id, total in p.query("SELECT * FROM orders"):
            where.setdefault((scope, order_id), []).append(i)
    assert where == {(s, i): [owner4[s]] for s in SCOPES for i in (1, 2, 3)}
    assert answers(d) == set()


def test_a_failing_hook_stops_before_anything_is_given_up(fresh_two_plus_two, tmp_path):
    d = fresh_two_plus_two
    fill(d)
    before = all_rows(d.partitions[:2])
    hook = tmp_path / "broken"
    hook.write_text("#!/bin/sh\nexit 3\n")
    hook.chmod(0o755)
    proxies, new = [px.dsn for px in d.proxies], [p.dsn for p in d.partitions[2:]]
    result = run_tool(proxies, new, hook=str(hook))
    assert result.returncode == 1 and "the hook failed in phase copy for partitions 0 and 2 (exit status 3)" \
        in result.stderr, result.stderr
    assert "Safe to leave: the old partitions serve every scope as before" in result.stderr, result.stderr
    assert "Next: once the hook is fixed, run the same command again" in result.stderr, result.stderr
    assert_ends_with_next_command(result, proxies, new)
    assert configs(d)[:2] == [(0, 2, True), (1, 2, True)]
    assert all_rows(d.partitions[:2]) == before and answers(d) == set()


# --- how a run ends: a lock it cannot get, an interrupt, the NEW databases in another order -------

def test_a_lock_timeout_names_the_session_that_holds_the_lock(fresh_two_plus_two):
    d = fresh_two_plus_two
    fill(d)
    before = all_rows(d.partitions[:2])
    proxies, new = [px.dsn for px in d.proxies], [p.dsn for p in d.partitions[2:]]
    with psycopg.connect(d.partitions[1].dsn, application_name="a long transaction") as holder:
        holder.execute("LOCK TABLE idem_keys IN ROW EXCLUSIVE MODE")      # as a writer in a transaction
        pid = holder.info.backend_pid
        result = run_tool(proxies, new, options=["--lock-timeout", "200ms"])
        assert result.returncode == 1, result.stderr
        assert "during step 2, freezing the writes of the old partitions on OLD partition 1" in result.stderr, \
            result.stderr
        assert "--lock-timeout 200ms" in result.stderr, result.stderr
        held = [line for line in result.stderr.splitlines() if f"pid {pid} " in line]
        assert len(held) == 1 and "application_name a long transaction" in held[0] \
            and "in a transaction since" in held[0] and "idem_keys RowExclusiveLock" in held[0], result.stderr
        assert "Safe to leave: the old partitions serve every scope as before" in result.stderr, result.stderr
        assert "Next: once those sessions are done (or with a longer --lock-timeout)" in result.stderr
        assert_ends_with_next_command(result, proxies, new)
        # nothing given up: the old partitions serve as before
        assert configs(d)[:2] == [(0, 2, True), (1, 2, True)] and all_rows(d.partitions[:2]) == before
        holder.rollback()
    assert answers(d) == set()
    repaired = run_tool(proxies, new, options=["--lock-timeout", "200ms"])
    assert repaired.returncode == 0, repaired.stderr
    assert configs(d) == [(i, 4, True) for i in range(4)] and answers(d) == set()


# A hook that interrupts the tool as Ctrl-C would: SIGINT to the reshard process (its nearest
# ancestor running idem_scaleout.py), then it waits for that process to end (a pidfd), so the
# interrupt arrives while the tool waits for the hook, whatever the machine's load.
INTERRUPTING_HOOK = """#!/usr/bin/python3
import os, select, signal, sys
if os.environ["IDEM_RESHARD_PHASE"] != sys.argv[1] or os.environ["IDEM_OLD_PARTITION"] != "0":
    sys.exit(0)
pid = os.getppid()
while b"idem_scaleout.py" not in open(f"/proc/{pid}/cmdline", "rb").read():
    pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
tool = os.pidfd_open(pid)
os.kill(pid, signal.SIGINT)
select.select([tool], [], [])
"""


@pytest.mark.parametrize("how", ["hook: copy", "hook: cleanup", "after: gave-up-first"])
def test_an_interrupt_ends_with_the_state_and_the_command_then_the_repair(fresh_two_plus_two, tmp_path, how):
    d = fresh_two_plus_two
    fill(d)
    before = all_rows(d.partitions)
    proxies, new = [px.dsn for px in d.proxies], [p.dsn for p in d.partitions[2:]]
    kind, _, where = how.partition(": ")
    hook = tmp_path / "interrupt"
    hook.write_text(INTERRUPTING_HOOK)
    hook.chmod(0o755)
    if kind == "hook":
        result = run_tool(proxies, new, hook=f"{hook} {where}")
    else:
        result = run_tool(proxies, new, interrupt_after=where)
    assert result.returncode == 130, (result.returncode, result.stderr)
    expected = {
        "copy": ("reshard interrupted during step 3, the hook's copy phase for partitions 0 and 2",
                 "Safe to leave: the old partitions serve every scope as before"),
        "cleanup": ("reshard interrupted during step 7, the hook's cleanup phase for partitions 0 and 2",
                    "Safe to leave: the keys are moved and every proxy routes by 4 partitions"),
        "gave-up-first": ("reshard interrupted during step 4, the old partitions giving up their moved scopes"
                          " on OLD partition 0", "NOT safe to leave: OLD partitions 0 (to 2) gave their moved"
                          " scopes up"),
    }[where]
    assert all(text in result.stderr for text in expected), result.stderr
    assert "Next: run the same command again" in result.stderr, result.stderr
    assert_ends_with_next_command(result, proxies, new)
    assert all(len(o) <= 1 for o in accepting_owners(d, SCOPES).values())
    if where == "copy":
        assert configs(d)[:2] == [(0, 2, True), (1, 2, True)] and answers(d) == set()
        assert all_rows(d.partitions[:2]) == before
    repaired = run_tool(proxies, new)
    assert repaired.returncode == 0, repaired.stderr
    assert configs(d) == [(i, 4, True) for i in range(4)] and answers(d) == set()
    assert set(all_rows(d.partitions)) == set(before)


@pytest.mark.parametrize("step", ["prepared", "gave-up-first", "switched-first"])
def test_a_repair_given_the_new_databases_in_another_order_keeps_the_recorded_order(fresh_two_plus_two, step):
    d = fresh_two_plus_two
    fill(d)
    before = all_rows(d.partitions)
    proxies, new = [px.dsn for px in d.proxies], [p.dsn for p in d.partitions[2:]]
    failed = run_tool(proxies, new, fail_after=step)
    assert failed.returncode == 1, failed.stderr

    repaired = run_tool(proxies, list(reversed(new)))
    assert repaired.returncode == 0, repaired.stderr
    assert "given in another order" in repaired.stdout, repaired.stdout
    # partition 2 is still the database first given as NEW, for every proxy
    assert configs(d) == [(i, 4, True) for i in range(4)]
    for options in proxy_options(d):
        assert len(options) == 4 and options[2:] == [f"p2={new[0]}", f"p3={new[1]}"], options
    after = all_rows(d.partitions)
    assert set(after) == set(before)
    with d.proxy.connect() as px:
        for (scope, key), copies in after.items():
            where = px.execute("SELECT idem_partition.idem_scope_partition(%s, 4)", [scope]).fetchone()[0]
            assert [i for i, _ in copies] == [where], (scope, key)
    assert answers(d) == set()


def test_a_repair_given_another_set_of_new_databases_is_refused(fresh_two_plus_two):
    d = fresh_two_plus_two
    fill(d)
    proxies, new = [px.dsn for px in d.proxies], [p.dsn for p in d.partitions[2:]]
    failed = run_tool(proxies, new, fail_after="prepared")
    assert failed.returncode == 1, failed.stderr
    spare = d.partitions[3]                  # a blank database of its own, beside NEW partition 3
    spare.psql_script("postgres", "CREATE DATABASE blank")
    spare.psql_script("blank", "CREATE EXTENSION idempotency")
    spare.psql_script("blank", file=HERE / "sql" / "partition.sql")
    blank = new[1].replace("dbname=idem", "dbname=blank")
    before = (all_rows(d.partitions), configs(d), proxy_options(d))
    for given in ([new[1], blank], [blank, new[1]], [new[0], blank], [blank, new[0]]):
        refused = run_tool(proxies, given)
        assert refused.returncode == 1 and "is not new" in refused.stderr, (given, refused.stderr)
        assert "nothing was changed" in refused.stderr, refused.stderr
        assert (all_rows(d.partitions), configs(d), proxy_options(d)) == before
    assert answers(d) == set()
