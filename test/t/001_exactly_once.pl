# Exactly-once under load: 32 pgbench clients hammer 200 keys.
#
# Phase 1 (claim, work and complete in one transaction per request):
#   BEGIN; claim; if claimed: insert the business row, complete; COMMIT (10%: ROLLBACK).
#   A claimer of a key that another transaction is inserting waits for it:
#   commit -> the key is succeeded -> replay; rollback -> no row -> claimed.
#   So no claimer ever sees in_progress, and every committed key is succeeded.
#
# Phase 2 (claim, then work, then complete in a second transaction, with a
# 30 ms lease so that work often outlives the lease): leases expire, keys are
# taken over (attempt + 1), the stale owner's idem_complete(attempt => n) is
# fenced off with IK002 and its business row rolls back with it; 10% of the
# owners "crash" after claiming (the key is left pending, to be taken over),
# 10% fail retryably (taken over later).  A final drain takes over whatever is
# left and completes it.
#
# Afterwards, for both phases: exactly one business row per succeeded key,
# none for any other key, no pending key left, no duplicate business row,
# and the business row was written by the attempt that completed the key.
#
# The business tables have NO unique constraint on key: a duplicate would show
# up as a second row, not as an error.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(usleep);

my $clients = 32;
my $node    = PostgreSQL::Test::Cluster->new('exactly_once');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
max_connections = 60
log_statement = none
log_min_messages = warning
});
$node->start;

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;

CREATE TABLE orders (
    key       text NOT NULL,   -- deliberately not unique
    attempt   integer NOT NULL,
    client_id integer NOT NULL,
    inserted  boolean NOT NULL
);
CREATE TABLE orders2 (
    key       text NOT NULL,   -- deliberately not unique
    attempt   integer NOT NULL,
    client_id integer NOT NULL
);
-- every claim that committed (phase 1: only those whose transaction committed)
CREATE TABLE claim_log (
    phase    integer NOT NULL,
    key      text NOT NULL,
    outcome  idem_outcome NOT NULL,
    inserted boolean NOT NULL,
    attempt  integer NOT NULL
);
CREATE TABLE fence_log (key text NOT NULL, attempt integer NOT NULL);

-- Phase 2 worker: insert the business row and complete the key in ONE
-- (sub)transaction; if the attempt was taken over, IK002 undoes both.
-- mode 2 fails the key (retryably) instead, without a business row.
CREATE FUNCTION finish_order(p_key text, p_attempt integer, p_client integer, p_mode integer)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF p_mode = 2 THEN
        PERFORM idem_fail(p_key, jsonb_build_object('client', p_client, 'attempt', p_attempt),
                          503, true, attempt => p_attempt);
        RETURN 'failed';
    END IF;
    INSERT INTO orders2 (key, attempt, client_id) VALUES (p_key, p_attempt, p_client);
    PERFORM idem_complete(p_key, jsonb_build_object('client', p_client, 'attempt', p_attempt),
                          201, attempt => p_attempt);
    RETURN 'completed';
EXCEPTION WHEN SQLSTATE 'IK002' THEN
    INSERT INTO fence_log VALUES (p_key, p_attempt);
    RETURN 'fenced';
END
$$;
});

# Run pgbench with a custom script; return (exit code, stdout, stderr).
sub run_pgbench
{
	my ($name, $script, $per_client) = @_;
	my $file = $node->basedir . "/$name.sql";
	PostgreSQL::Test::Utils::append_to_file($file, $script);
	my @cmd = (
		'pgbench', '-n', '-c', $clients, '-j', 4, '-t', $per_client,
		'-h', $node->host, '-p', $node->port, '-f', $file, 'postgres');
	my ($out, $err) = ('', '');
	note "running: @cmd";
	IPC::Run::run(\@cmd, '>', \$out, '2>', \$err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	my $rc = $? >> 8;
	note "pgbench $name stdout:\n$out";
	diag "pgbench $name stderr:\n$err" if $err ne '';
	return ($rc, $out, $err);
}

sub check_pgbench
{
	my ($name, $rc, $out, $err, $per_client) = @_;
	my $total = $clients * $per_client;
	is($rc, 0, "$name: pgbench exits 0");
	like($out, qr/number of transactions actually processed: $total\/$total\b/,
		"$name: all $total transactions processed");
	like($out, qr/number of failed transactions: 0 \(/,
		"$name: no failed transactions");
	unlike($err, qr/ERROR|aborted/, "$name: no client error or abort");
}

sub query { return $node->safe_psql('postgres', $_[0]); }

# ---------------------------------------------------------------------------
# Phase 1: claim, work and complete in one transaction
# ---------------------------------------------------------------------------
my $per_client1 = 100;
my ($rc, $out, $err) = run_pgbench('phase1', q{
\set k random(1, 200)
\set r random(1, 10)
BEGIN;
WITH c AS MATERIALIZED (
    SELECT * FROM idem_claim('k' || :k, jsonb_build_object('key', :k))
), l AS (
    INSERT INTO claim_log SELECT 1, 'k' || :k, outcome, inserted, attempt FROM c
)
SELECT (outcome = 'claimed')::int AS owned, attempt, inserted::int AS ins FROM c \gset
\if :owned
INSERT INTO orders (key, attempt, client_id, inserted) VALUES ('k' || :k, :attempt, :client_id, :ins = 1);
SELECT state FROM idem_complete('k' || :k, jsonb_build_object('client', :client_id, 'attempt', :attempt), 201, attempt => :attempt);
\endif
\if :r = 1
ROLLBACK;
\else
COMMIT;
\endif
}, $per_client1);
check_pgbench('phase 1', $rc, $out, $err, $per_client1);

my $keys1 = query(q{SELECT count(*) FROM idem_keys WHERE key LIKE 'k%'});
ok($keys1 > 0 && $keys1 <= 200, "phase 1: between 1 and 200 keys exist (got $keys1)");
is(query(q{SELECT count(*) FROM idem_keys WHERE key LIKE 'k%' AND state = 'pending'}),
	'0', 'phase 1: no pending key left');
is(query(q{SELECT count(*) FROM idem_keys WHERE key LIKE 'k%' AND state <> 'succeeded'}),
	'0', 'phase 1: every key is succeeded');
is(query(q{SELECT count(*) FROM (SELECT key FROM orders GROUP BY key HAVING count(*) > 1) d}),
	'0', 'phase 1: no duplicate business row');
is( query(
		q{SELECT count(*) FROM idem_keys k
		   WHERE k.key LIKE 'k%' AND k.state = 'succeeded'
		     AND (SELECT count(*) FROM orders o WHERE o.key = k.key) <> 1}),
	'0', 'phase 1: exactly one business row per succeeded key');
is( query(
		q{SELECT count(*) FROM orders o
		   WHERE NOT EXISTS (SELECT FROM idem_keys k
		                      WHERE k.scope = '' AND k.key = o.key AND k.state = 'succeeded')}),
	'0', 'phase 1: no business row without a succeeded key');
is( query(
		q{SELECT count(*) FROM orders o JOIN idem_keys k ON k.scope = '' AND k.key = o.key
		   WHERE k.attempt <> o.attempt OR k.response_code <> 201
		      OR k.response <> jsonb_build_object('client', o.client_id, 'attempt', o.attempt)}),
	'0', 'phase 1: each key stores the response of the transaction that wrote its business row');
is(query(q{SELECT count(*) FROM orders WHERE attempt <> 1 OR NOT inserted}),
	'0', 'phase 1: every owner inserted the key itself (attempt 1, inserted true)');
is( query(
		q{SELECT count(*) FROM (SELECT key FROM claim_log WHERE phase = 1 AND outcome = 'claimed'
		                          GROUP BY key HAVING count(*) <> 1) d}),
	'0', 'phase 1: each key was owned by exactly one committed claim');
is(query(q{SELECT count(*) FROM claim_log WHERE phase = 1 AND outcome = 'in_progress'}),
	'0', 'phase 1: nobody saw in_progress (claimers wait for the inserting transaction)');
my $replays1 = query(q{SELECT count(*) FROM claim_log WHERE phase = 1 AND outcome = 'replay'});
ok($replays1 > 0, "phase 1: retries were replayed ($replays1 replays)");
is( query(
		q{SELECT count(*) FROM claim_log l JOIN idem_keys k ON k.scope = '' AND k.key = l.key
		   WHERE l.phase = 1 AND l.outcome = 'replay' AND (l.attempt <> k.attempt OR l.inserted)}),
	'0', 'phase 1: replays report the key\'s attempt and inserted false');
note "phase 1 outcomes: "
  . query(q{SELECT string_agg(outcome || '=' || n, ' ') FROM
	          (SELECT outcome, count(*) n FROM claim_log WHERE phase = 1 GROUP BY 1 ORDER BY 1) s});

# ---------------------------------------------------------------------------
# Phase 2: claim (committed), work outliving a 30 ms lease, complete with fencing
# ---------------------------------------------------------------------------
my $per_client2 = 50;
($rc, $out, $err) = run_pgbench('phase2', q{
\set k random(1, 100)
\set r random(1, 10)
\set work random(0, 60)
WITH c AS MATERIALIZED (
    SELECT * FROM idem_claim('t' || :k, jsonb_build_object('key', :k), lease => '30 milliseconds')
), l AS (
    INSERT INTO claim_log SELECT 2, 't' || :k, outcome, inserted, attempt FROM c
)
SELECT (outcome = 'claimed')::int AS owned, attempt FROM c \gset
\if :owned
\sleep :work ms
\if :r = 1
\set abandoned 1
\else
SELECT finish_order('t' || :k, :attempt, :client_id, :r);
\endif
\endif
}, $per_client2);
check_pgbench('phase 2', $rc, $out, $err, $per_client2);

# Drain: wait until every lease has run out, then take over what is left
# (pending or failed-retryable) and complete it.
usleep(200_000);
$node->safe_psql(
	'postgres', q{
DO $$
DECLARE
    k text;
    c idem_claim_result;
BEGIN
    FOR k IN SELECT key FROM idem_keys
              WHERE key LIKE 't%' AND (state = 'pending' OR (state = 'failed' AND retryable))
    LOOP
        c := idem_claim(k, jsonb_build_object('key', substr(k, 2)::int));
        IF c.outcome <> 'claimed' OR c.inserted THEN
            RAISE EXCEPTION 'drain: claim of % gave %, inserted %', k, c.outcome, c.inserted;
        END IF;
        INSERT INTO claim_log VALUES (3, k, c.outcome, c.inserted, c.attempt);
        IF finish_order(k, c.attempt, -1, 3) <> 'completed' THEN
            RAISE EXCEPTION 'drain: could not complete %', k;
        END IF;
    END LOOP;
END
$$;
});

my $keys2 = query(q{SELECT count(*) FROM idem_keys WHERE key LIKE 't%'});
ok($keys2 > 0 && $keys2 <= 100, "phase 2: between 1 and 100 keys exist (got $keys2)");
is(query(q{SELECT count(*) FROM idem_keys WHERE key LIKE 't%' AND state = 'pending'}),
	'0', 'phase 2: no pending key left');
is(query(q{SELECT count(*) FROM idem_keys WHERE key LIKE 't%' AND state <> 'succeeded'}),
	'0', 'phase 2: every key is succeeded');
is(query(q{SELECT count(*) FROM (SELECT key FROM orders2 GROUP BY key HAVING count(*) > 1) d}),
	'0', 'phase 2: no duplicate business row');
is( query(
		q{SELECT count(*) FROM idem_keys k
		   WHERE k.key LIKE 't%' AND k.state = 'succeeded'
		     AND (SELECT count(*) FROM orders2 o WHERE o.key = k.key) <> 1}),
	'0', 'phase 2: exactly one business row per succeeded key');
is( query(
		q{SELECT count(*) FROM orders2 o
		   WHERE NOT EXISTS (SELECT FROM idem_keys k
		                      WHERE k.scope = '' AND k.key = o.key AND k.state = 'succeeded')}),
	'0', 'phase 2: no business row without a succeeded key');
is( query(
		q{SELECT count(*) FROM orders2 o JOIN idem_keys k ON k.scope = '' AND k.key = o.key
		   WHERE k.attempt <> o.attempt OR k.response_code <> 201
		      OR k.response <> jsonb_build_object('client', o.client_id, 'attempt', o.attempt)}),
	'0', 'phase 2: the business row was written by the attempt that completed the key');
is( query(
		q{SELECT count(*) FROM (SELECT key FROM claim_log WHERE phase IN (2, 3) AND inserted
		                          GROUP BY key HAVING count(*) <> 1) d}),
	'0', 'phase 2: each key was inserted exactly once (inserted true once)');
is( query(
		q{SELECT count(DISTINCT key) FROM claim_log WHERE phase IN (2, 3) AND inserted}),
	$keys2, 'phase 2: every key has its inserting claim');
is( query(
		q{SELECT count(*) FROM (SELECT key, attempt FROM claim_log
		                         WHERE phase IN (2, 3) AND outcome = 'claimed'
		                         GROUP BY key, attempt HAVING count(*) > 1) d}),
	'0', 'phase 2: no two callers ever owned the same attempt of a key');
is( query(
		q{SELECT count(*) FROM claim_log WHERE phase IN (2, 3) AND outcome = 'claimed'
		     AND (inserted <> (attempt = 1))}),
	'0', 'phase 2: inserted is true exactly for attempt 1 (takeovers are not inserts)');
is( query(
		q{SELECT count(*) FROM idem_keys k
		   WHERE k.key LIKE 't%'
		     AND k.attempt <> (SELECT max(attempt) FROM claim_log l
		                        WHERE l.key = k.key AND l.outcome = 'claimed')}),
	'0', 'phase 2: each key\'s attempt is its last owned attempt');
my $takeovers =
  query(q{SELECT count(*) FROM claim_log WHERE phase = 2 AND outcome = 'claimed' AND NOT inserted});
ok($takeovers > 0, "phase 2: expired leases were taken over ($takeovers takeovers)");
my $in_progress =
  query(q{SELECT count(*) FROM claim_log WHERE phase = 2 AND outcome = 'in_progress'});
ok($in_progress > 0, "phase 2: live leases were reported in_progress ($in_progress times)");
is( query(
		q{SELECT count(*) FROM fence_log f JOIN idem_keys k ON k.scope = '' AND k.key = f.key
		   WHERE f.attempt >= k.attempt}),
	'0', 'phase 2: only attempts that were later taken over were fenced off');
note "phase 2 outcomes: "
  . query(q{SELECT string_agg(outcome || '=' || n, ' ') FROM
	          (SELECT outcome, count(*) n FROM claim_log WHERE phase = 2 GROUP BY 1 ORDER BY 1) s});
note "phase 2 fenced completions (IK002): " . query(q{SELECT count(*) FROM fence_log});
note "phase 2 drained keys: " . query(q{SELECT count(*) FROM claim_log WHERE phase = 3});

$node->stop;
done_testing();
