"""The resharding tool as an operator runs it (the command line), against two proxies: it refuses,
changing nothing, whatever is wrong with its arguments or the databases they name; a run that
fails after any of its steps leaves no scope with two accepting partitions, and the same command
run again (the repair) leaves a serving cluster of 4 partitions with every key once, unchanged."""

import os
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


def run_tool(proxies, new_dsns, fail_after=None, hook=None):
    env = dict(os.environ, PATH=f"{BINDIR}:{os.environ['PATH']}")    # the hook's psql
    env.pop(idem_scaleout.FAIL_AFTER, None)
    if fail_after:
        env[idem_scaleout.FAIL_AFTER] = fail_after
    args = [sys.executable, str(TOOL), "reshard"]
    for proxy in proxies:
        args += ["--proxy", proxy]
    if hook:
        args += ["--hook", hook]
    return subprocess.run(args + list(new_dsns), capture_output=True, text=True, env=env, timeout=300)


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
    assert failed.returncode != 0 and f"failure injected after step {step}" in failed.stderr, failed.stderr

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
    result = run_tool([px.dsn for px in d.proxies], [p.dsn for p in d.partitions[2:]], hook=str(hook))
    assert result.returncode != 0 and "the hook failed in phase copy" in result.stderr, result.stderr
    assert configs(d)[:2] == [(0, 2, True), (1, 2, True)]
    assert all_rows(d.partitions[:2]) == before and answers(d) == set()
