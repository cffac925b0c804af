# Exactly-once under load: 32 pgbench clients hammer 200 keys, in each edition (docs/editions.md).
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
#
# Editions.  One cluster, two databases: the C edition (CREATE EXTENSION, its library preloaded)
# and the SQL edition (its plain-SQL install from sql-edition/build, as in
# 070_editions_differential.pl).  The same scenario runs in both, 32 clients each, phase 1 in
# the two editions at the same time and phase 2 one after the other (below); every check counts
# rows of its own database, and its name starts with its edition.  What the C edition has only
# when preloaded plays no part here: phase 1's claimers wait for the inserting transaction's
# row lock, not for a wake-up; phase 2 claims without `wait`, so a live lease answers
# in_progress at once in both editions (docs/contract.md §9.3); no check reads the statistics;
# and the default ttl (1 day) leaves the reaper nothing to delete (a reaper started in the SQL
# edition's database leaves at once: no extension there).  The SQL edition's defaults come from
# the settings the preloaded C library defines (SHOW gives `1d` and `1min`), which it reads
# with their units.
#
# IDEMPOTENCY_ONCE_SEED=<n> sets pgbench's random seed (printed); the interleaving remains
# the scheduler's.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use File::Temp qw(tempdir);
use FindBin;

my $clients = 32;
my $seed = $ENV{IDEMPOTENCY_ONCE_SEED} || (time ^ ($$ << 8)) % 2_000_000_000;
diag "pgbench random seed $seed (replay: IDEMPOTENCY_ONCE_SEED=$seed)";

my @editions = ('c', 'sql');
my %db       = (c => 'edition_c', sql => 'edition_sql');
my %label    = (c => 'C edition', sql => 'SQL edition');

# ---- the SQL edition's plain-SQL install, made by its generator (missing: the test fails)
my $root  = "$FindBin::RealBin/../..";
my $gen   = tempdir(CLEANUP => 1);
my ($build_out, $build_err) = ('', '');
IPC::Run::run([ 'bash', "$root/sql-edition/build", $gen ], '>', \$build_out, '2>', \$build_err);
my ($plain) = glob("$gen/plain/idempotency-*.sql");
ok(defined $plain && -s $plain, 'sql-edition/build made the plain-SQL install file')
  or do { diag $build_err; done_testing(); exit; };

my $node = PostgreSQL::Test::Cluster->new('exactly_once');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
max_connections = 90
log_statement = none
log_min_messages = warning
});
$node->start;

$node->safe_psql('postgres', "CREATE DATABASE $db{$_}") for @editions;
$node->safe_psql($db{c}, 'CREATE EXTENSION idempotency');
{
	my ($out, $err) = ('', '');
	local $ENV{PGOPTIONS} = '-c client_min_messages=warning';
	IPC::Run::run([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr($db{sql}), '-f', $plain ],
		'>', \$out, '2>', \$err);
	is($err, '', 'the SQL edition installs with psql -f');
}

sub query { my ($e, $sql) = @_; return $node->safe_psql($db{$e}, $sql); }

# Named scalar queries, answered by one statement (a psql start per check would cost seconds).
sub counts
{
	my ($e, $what, @named) = @_;
	my (@names, @subqueries);
	while (my ($name, $sql) = splice(@named, 0, 2))
	{
		push @names, $name;
		push @subqueries, "($sql)";
	}
	my @values = split /\|/, query($e, 'SELECT ' . join(",\n       ", @subqueries)), -1;
	is(scalar @values, scalar @names, "$what: one answer per check") or diag "@values";
	my %n;
	@n{@names} = @values;
	return %n;
}

# The checks both phases make of their keys (those starting with $prefix) against the business
# table $table: every key succeeded with exactly one business row, written by the attempt that
# completed it and answering with its response.
sub key_checks
{
	my ($prefix, $table) = @_;
	return (
		keys => qq{SELECT count(*) FROM idem_keys WHERE key LIKE '$prefix%'},
		pending => qq{SELECT count(*) FROM idem_keys WHERE key LIKE '$prefix%' AND state = 'pending'},
		not_succeeded => qq{SELECT count(*) FROM idem_keys WHERE key LIKE '$prefix%' AND state <> 'succeeded'},
		duplicates => qq{SELECT count(*) FROM (SELECT key FROM $table GROUP BY key HAVING count(*) > 1) d},
		not_one_row => qq{SELECT count(*) FROM idem_keys k
		                   WHERE k.key LIKE '$prefix%' AND k.state = 'succeeded'
		                     AND (SELECT count(*) FROM $table o WHERE o.key = k.key) <> 1},
		orphan_rows => qq{SELECT count(*) FROM $table o
		                   WHERE NOT EXISTS (SELECT FROM idem_keys k
		                                      WHERE k.scope = '' AND k.key = o.key AND k.state = 'succeeded')},
		wrong_response => qq{SELECT count(*) FROM $table o JOIN idem_keys k ON k.scope = '' AND k.key = o.key
		                      WHERE k.attempt <> o.attempt OR k.response_code <> 201
		                         OR k.response <> jsonb_build_object('client', o.client_id, 'attempt', o.attempt)});
}

for my $e (@editions)
{
	is(query($e, 'SELECT idem_edition()'), $e, "$label{$e}: idem_edition() answers '$e'");
	is( query($e, q{SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
	                 WHERE p.oid = 'idem_claim'::regproc}),
		$e eq 'c' ? 'c' : 'plpgsql', "$label{$e}: idem_claim is " . ($e eq 'c' ? 'a C function' : 'PL/pgSQL'));

	query($e, q{
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
}

# Run one pgbench per edition with a custom script, the editions at the same time or one after
# the other; check each.
sub run_phase
{
	my ($name, $together, $script, $per_client) = @_;
	(my $file = $node->basedir . "/$name.sql") =~ s/ /_/g;
	PostgreSQL::Test::Utils::append_to_file($file, $script);
	my %run;
	for my $e (@editions)
	{
		my @cmd = (
			'pgbench', '-n', '-c', $clients, '-j', 4, '-t', $per_client, "--random-seed=$seed",
			'-h', $node->host, '-p', $node->port, '-f', $file, $db{$e});
		my $r = $run{$e} = { out => '', err => '' };
		note "running: @cmd";
		$r->{h} = IPC::Run::start(\@cmd, '>', \$r->{out}, '2>', \$r->{err},
			IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
		$r->{h}->finish unless $together;
	}
	my $total = $clients * $per_client;
	for my $e (@editions)
	{
		my $r = $run{$e};
		$r->{h}->finish if $together;
		my $rc = $r->{h}->full_result >> 8;
		my $what = "$label{$e}: $name";
		note "pgbench $what stdout:\n$r->{out}";
		$r->{err} =~ s/^pgbench: setting random seed to \d+\n//m;
		diag "pgbench $what stderr:\n$r->{err}" if $r->{err} ne '';
		is($rc, 0, "$what: pgbench exits 0");
		like($r->{out}, qr/number of transactions actually processed: $total\/$total\b/,
			"$what: all $total transactions processed");
		like($r->{out}, qr/number of failed transactions: 0 \(/, "$what: no failed transactions");
		unlike($r->{err}, qr/ERROR|aborted/, "$what: no client error or abort");
	}
	return;
}

# ---------------------------------------------------------------------------
# Phase 1: claim, work and complete in one transaction
# ---------------------------------------------------------------------------
# Both editions at once: no check of this phase depends on timing, and the phase is CPU-bound.
run_phase('phase 1', 1, q{
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
}, 100);

for my $e (@editions)
{
	my $p = "$label{$e}: phase 1";
	my %n = counts($e, $p,
		key_checks('k', 'orders'),
		not_inserter => q{SELECT count(*) FROM orders WHERE attempt <> 1 OR NOT inserted},
		owners_not_one => q{SELECT count(*) FROM (SELECT key FROM claim_log WHERE phase = 1 AND outcome = 'claimed'
		                                           GROUP BY key HAVING count(*) <> 1) d},
		in_progress => q{SELECT count(*) FROM claim_log WHERE phase = 1 AND outcome = 'in_progress'},
		replays => q{SELECT count(*) FROM claim_log WHERE phase = 1 AND outcome = 'replay'},
		bad_replays => q{SELECT count(*) FROM claim_log l JOIN idem_keys k ON k.scope = '' AND k.key = l.key
		                  WHERE l.phase = 1 AND l.outcome = 'replay' AND (l.attempt <> k.attempt OR l.inserted)},
		outcomes => q{SELECT string_agg(outcome || '=' || n, ' ') FROM
		               (SELECT outcome, count(*) n FROM claim_log WHERE phase = 1 GROUP BY 1 ORDER BY 1) s});
	ok($n{keys} > 0 && $n{keys} <= 200, "$p: between 1 and 200 keys exist (got $n{keys})");
	is($n{pending},       '0', "$p: no pending key left");
	is($n{not_succeeded}, '0', "$p: every key is succeeded");
	is($n{duplicates},    '0', "$p: no duplicate business row");
	is($n{not_one_row},   '0', "$p: exactly one business row per succeeded key");
	is($n{orphan_rows},   '0', "$p: no business row without a succeeded key");
	is($n{wrong_response}, '0', "$p: each key stores the response of the transaction that wrote its business row");
	is($n{not_inserter},  '0', "$p: every owner inserted the key itself (attempt 1, inserted true)");
	is($n{owners_not_one}, '0', "$p: each key was owned by exactly one committed claim");
	is($n{in_progress},   '0', "$p: nobody saw in_progress (claimers wait for the inserting transaction)");
	ok($n{replays} > 0, "$p: retries were replayed ($n{replays} replays)");
	is($n{bad_replays},   '0', "$p: replays report the key's attempt and inserted false");
	note "$p outcomes: $n{outcomes}";
}

# ---------------------------------------------------------------------------
# Phase 2: claim (committed), work outliving a 30 ms lease, complete with fencing
# ---------------------------------------------------------------------------
# One edition after the other: how often a claim finds a live 30 ms lease (in_progress) depends
# on how fast the clients go, and two editions at once made it two to three times rarer (26 to
# 36 in_progress per edition, against 68 to 87 for the C edition alone); mostly sleeping, the
# phase takes about a second per edition.
run_phase('phase 2', 0, q{
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
}, 50);

for my $e (@editions)
{
	my $p = "$label{$e}: phase 2";

	# Drain: once the database clock has passed every lease (a statement of its own: the claims
	# read the clock, not the transaction's start), take over what is left (pending or failed
	# retryably) and complete it.
	query($e, q{SELECT pg_sleep_until(max(locked_until) + interval '1 millisecond')
	              FROM idem_keys WHERE key LIKE 't%' AND state = 'pending'});
	query($e, q{
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

	my %n = counts($e, $p,
		key_checks('t', 'orders2'),
		inserts_not_one => q{SELECT count(*) FROM (SELECT key FROM claim_log WHERE phase IN (2, 3) AND inserted
		                                            GROUP BY key HAVING count(*) <> 1) d},
		inserted_keys => q{SELECT count(DISTINCT key) FROM claim_log WHERE phase IN (2, 3) AND inserted},
		attempt_owned_twice => q{SELECT count(*) FROM (SELECT key, attempt FROM claim_log
		                                                WHERE phase IN (2, 3) AND outcome = 'claimed'
		                                                GROUP BY key, attempt HAVING count(*) > 1) d},
		inserted_not_first => q{SELECT count(*) FROM claim_log WHERE phase IN (2, 3) AND outcome = 'claimed'
		                           AND (inserted <> (attempt = 1))},
		attempt_not_last => q{SELECT count(*) FROM idem_keys k
		                       WHERE k.key LIKE 't%'
		                         AND k.attempt <> (SELECT max(attempt) FROM claim_log l
		                                            WHERE l.key = k.key AND l.outcome = 'claimed')},
		takeovers => q{SELECT count(*) FROM claim_log WHERE phase = 2 AND outcome = 'claimed' AND NOT inserted},
		in_progress => q{SELECT count(*) FROM claim_log WHERE phase = 2 AND outcome = 'in_progress'},
		fenced_current => q{SELECT count(*) FROM fence_log f JOIN idem_keys k ON k.scope = '' AND k.key = f.key
		                     WHERE f.attempt >= k.attempt},
		outcomes => q{SELECT string_agg(outcome || '=' || n, ' ') FROM
		               (SELECT outcome, count(*) n FROM claim_log WHERE phase = 2 GROUP BY 1 ORDER BY 1) s},
		fenced => q{SELECT count(*) FROM fence_log},
		drained => q{SELECT count(*) FROM claim_log WHERE phase = 3});
	ok($n{keys} > 0 && $n{keys} <= 100, "$p: between 1 and 100 keys exist (got $n{keys})");
	is($n{pending},        '0', "$p: no pending key left");
	is($n{not_succeeded},  '0', "$p: every key is succeeded");
	is($n{duplicates},     '0', "$p: no duplicate business row");
	is($n{not_one_row},    '0', "$p: exactly one business row per succeeded key");
	is($n{orphan_rows},    '0', "$p: no business row without a succeeded key");
	is($n{wrong_response}, '0', "$p: the business row was written by the attempt that completed the key");
	is($n{inserts_not_one}, '0', "$p: each key was inserted exactly once (inserted true once)");
	is($n{inserted_keys}, $n{keys}, "$p: every key has its inserting claim");
	is($n{attempt_owned_twice}, '0', "$p: no two callers ever owned the same attempt of a key");
	is($n{inserted_not_first}, '0', "$p: inserted is true exactly for attempt 1 (takeovers are not inserts)");
	is($n{attempt_not_last}, '0', "$p: each key's attempt is its last owned attempt");
	ok($n{takeovers} > 0,   "$p: expired leases were taken over ($n{takeovers} takeovers)");
	ok($n{in_progress} > 0, "$p: live leases were reported in_progress ($n{in_progress} times)");
	is($n{fenced_current}, '0', "$p: only attempts that were later taken over were fenced off");
	note "$p outcomes: $n{outcomes}";
	note "$p fenced completions (IK002): $n{fenced}";
	note "$p drained keys: $n{drained}";
}

$node->stop;
done_testing();
