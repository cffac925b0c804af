# Exactly-once under stress, in both usage modes at once: 64 pgbench clients, contention on 50
# keys per scope at a time (the 50 keys change every 500 ms, so new keys are fought over all the
# time), random rollbacks, random lease expiries, takeovers and fenced completions.
#
# Scope 'tx', same-transaction mode (script tx.sql):
#   BEGIN; claim (logged in the same transaction);
#   if claimed: 90% insert the business row and complete; 10% a final business error: roll back
#   to a savepoint and idem_fail(retryable => false);
#   COMMIT, or ROLLBACK (10%, independently).
# Scope 'lease', lease mode (script lease.sql):
#   claim with a random lease of 5..60 ms (autocommit, logged in the same statement);
#   if claimed: "work" for a random 0..80 ms (so the lease often runs out and the key is taken
#   over), then finish(): 70% insert the business row and complete with attempt => the claimed
#   attempt, in one transaction; 10% fail retryable; 5% fail final; 5% the same as complete but
#   the transaction rolls back; 10% abandon the key (the worker "crashed").  A completion whose
#   attempt was taken over gets IK002; finish() catches exactly that, which rolls back its
#   business row with it, and records the fencing.
# Scopes 'txwait' and 'leasewait' run the same two scripts with `wait` (docs/contract.md §9.3): a random 0..30 ms
# (a quarter of them 0, NOWAIT) in same-transaction mode, where an uncommitted duplicate ends as
# in_progress with no row to show; a random 0..100 ms in lease mode, where a waiter ends as a
# replay (woken by the owner's commit), a takeover (lease ended, or a retryable failure) or
# in_progress. The same invariants hold for them, plus what waiting adds: a row-less in_progress
# only with `wait`, a visible in_progress only on a pending key.
#
# IK003 (key does not exist) can never be right for a key the client claimed: finish() records it
# in anomaly_log, checked below.  Any other error makes pgbench abort the client: there must be
# none.
#
# Phase 2 aims at one race: 16 clients on ONE key, two thirds taking it over again and again
# (each takeover moves expires_at, so the new row version gets new index entries), one third
# calling idem_complete / idem_fail with a stale attempt.  Every one of those must get IK002.
#
# Then a drain takes over and completes whatever is still pending or failed-retryable, and SQL
# invariants are checked for both scopes: no duplicate business row, exactly one business row per
# succeeded key, written by the attempt that completed it; no business row without its succeeded
# key; no pending key left; every replay a client was given is the key's final response (no lost
# key); no attempt owned twice; attempts counted exactly; only taken-over attempts were fenced.
#
# IDEMPOTENCY_STRESS_SECONDS (default 20) sets the pgbench duration (a longer soak run).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(sleep);

my $clients = 64;
my $seconds = $ENV{IDEMPOTENCY_STRESS_SECONDS} || 20;

my $node = PostgreSQL::Test::Cluster->new('stress');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
max_connections = 100
log_statement = none
log_min_messages = warning
# the keys must stay until the checks
idempotency.reaper_enabled = off
});
$node->start;

sub query { return $node->safe_psql('postgres', $_[0]); }

query(q{
CREATE EXTENSION idempotency;

-- deliberately no unique constraint: a duplicate shows up as a second row
CREATE TABLE biz (scope text NOT NULL, key text NOT NULL, attempt integer NOT NULL, client integer NOT NULL);
CREATE INDEX ON biz (scope, key);
-- every committed claim and what it answered
-- (attempt and state are NULL in an in_progress answer behind another transaction's uncommitted write)
CREATE TABLE claim_log (scope text NOT NULL, key text NOT NULL, outcome idem_outcome NOT NULL,
                        inserted boolean NOT NULL, attempt integer, state idem_state,
                        response jsonb, response_code integer);
CREATE INDEX ON claim_log (scope, key);
CREATE TABLE fence_log (scope text NOT NULL, key text NOT NULL, attempt integer NOT NULL);
CREATE TABLE outcome_log (scope text NOT NULL, what text NOT NULL);
CREATE TABLE anomaly_log (scope text NOT NULL, key text NOT NULL, attempt integer NOT NULL,
                          sqlstate text NOT NULL, message text NOT NULL);

-- lease mode, second transaction: business row and completion together; IK002 undoes both
CREATE FUNCTION finish(p_key text, p_attempt integer, p_client integer, p_mode integer, p_scope text)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF p_mode IN (2, 3) THEN
        PERFORM idem_fail(p_key, jsonb_build_object('error', 'transient', 'attempt', p_attempt), 503,
                          retryable => true, scope => p_scope, attempt => p_attempt);
        RETURN 'failed retryable';
    ELSIF p_mode = 4 THEN
        PERFORM idem_fail(p_key, jsonb_build_object('error', 'final', 'attempt', p_attempt), 402,
                          retryable => false, scope => p_scope, attempt => p_attempt);
        RETURN 'failed final';
    END IF;
    INSERT INTO biz VALUES (p_scope, p_key, p_attempt, p_client);
    PERFORM idem_complete(p_key, jsonb_build_object('client', p_client, 'attempt', p_attempt), 201,
                          scope => p_scope, attempt => p_attempt);
    RETURN 'completed';
EXCEPTION
    WHEN SQLSTATE 'IK002' THEN
        INSERT INTO fence_log VALUES (p_scope, p_key, p_attempt);
        RETURN 'fenced';
    WHEN SQLSTATE 'IK003' THEN
        -- never right: this client claimed the key and nothing deletes keys here.  Recorded
        -- (and checked below) instead of aborting the client, so that the rest still runs.
        INSERT INTO anomaly_log VALUES (p_scope, p_key, p_attempt, SQLSTATE, SQLERRM);
        RETURN 'IK003';
END
$$;

-- phase 2: stale completions and failures racing with takeovers of one key
CREATE TABLE race_log (fn text NOT NULL, sqlstate text NOT NULL);
CREATE FUNCTION stale_finish(p_fail boolean) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_fail THEN
        PERFORM idem_fail('race', '{"stale": true}', scope => 'race', attempt => 0);
    ELSE
        PERFORM idem_complete('race', '{"stale": true}', scope => 'race', attempt => 0);
    END IF;
    INSERT INTO race_log VALUES (CASE WHEN p_fail THEN 'fail' ELSE 'complete' END, '00000');
EXCEPTION WHEN OTHERS THEN
    INSERT INTO race_log VALUES (CASE WHEN p_fail THEN 'fail' ELSE 'complete' END, SQLSTATE);
END
$$;
});

my $tx_script = q{
\set k random(1, 50)
\set r random(1, 10)
\set e random(1, 10)
\set w random(-10, 30)
SELECT floor(extract(epoch FROM clock_timestamp()) * 2)::bigint AS slot \gset
BEGIN;
WITH c AS MATERIALIZED (
    SELECT * FROM idem_claim('k' || :slot || '-' || :k, jsonb_build_object('k', :k), scope => 'SCOPE'WAIT)
), l AS (
    INSERT INTO claim_log SELECT 'SCOPE', 'k' || :slot || '-' || :k, outcome, inserted, attempt, state, response, response_code FROM c
)
SELECT (outcome = 'claimed')::int AS owned, attempt FROM c \gset
\if :owned
\if :e = 1
SAVEPOINT work;
INSERT INTO biz VALUES ('SCOPE', 'k' || :slot || '-' || :k, :attempt, :client_id);
ROLLBACK TO SAVEPOINT work;
SELECT 1 FROM idem_fail('k' || :slot || '-' || :k, jsonb_build_object('error', 'declined', 'attempt', :attempt), 402,
                        retryable => false, scope => 'SCOPE', attempt => :attempt);
\else
INSERT INTO biz VALUES ('SCOPE', 'k' || :slot || '-' || :k, :attempt, :client_id);
SELECT 1 FROM idem_complete('k' || :slot || '-' || :k, jsonb_build_object('client', :client_id, 'attempt', :attempt), 201,
                            scope => 'SCOPE', attempt => :attempt);
\endif
\endif
\if :r = 1
ROLLBACK;
INSERT INTO outcome_log VALUES ('SCOPE', 'rollback');
\else
COMMIT;
\endif
};

my $lease_script = q{
\set k random(1, 50)
\set lease random(5, 60)
\set work random(0, 80)
\set m random(1, 20)
\set w random(0, 100)
SELECT floor(extract(epoch FROM clock_timestamp()) * 2)::bigint AS slot \gset
WITH c AS MATERIALIZED (
    SELECT * FROM idem_claim('k' || :slot || '-' || :k, jsonb_build_object('k', :k), scope => 'SCOPE',
                             lease => make_interval(secs => :lease / 1000.0)WAIT)
), l AS (
    INSERT INTO claim_log SELECT 'SCOPE', 'k' || :slot || '-' || :k, outcome, inserted, attempt, state, response, response_code FROM c
)
SELECT (outcome = 'claimed')::int AS owned, attempt FROM c \gset
\if :owned
\sleep :work ms
\if :m <= 2
INSERT INTO outcome_log VALUES ('SCOPE', 'abandoned');
\elif :m = 3
BEGIN;
SELECT finish('k' || :slot || '-' || :k, :attempt, :client_id, 1, 'SCOPE');
ROLLBACK;
INSERT INTO outcome_log VALUES ('SCOPE', 'rolled back');
\else
INSERT INTO outcome_log SELECT 'SCOPE', finish('k' || :slot || '-' || :k, :attempt, :client_id,
                                               CASE WHEN :m <= 5 THEN 2 WHEN :m = 6 THEN 4 ELSE 1 END, 'SCOPE');
\endif
\endif
};

# The four scripts: each mode without and with `wait`.
my $wait = ', wait => make_interval(secs => greatest(:w, 0) / 1000.0)';
my %scripts = (
	tx => [ $tx_script, '' ],
	lease => [ $lease_script, '' ],
	txwait => [ $tx_script, $wait ],
	leasewait => [ $lease_script, $wait ]);
my @files;
for my $scope (sort keys %scripts)
{
	my ($text, $wait_arg) = @{ $scripts{$scope} };
	$text =~ s/SCOPE/$scope/g;
	$text =~ s/WAIT/$wait_arg/g;
	my $file = $node->basedir . "/$scope.sql";
	PostgreSQL::Test::Utils::append_to_file($file, $text);
	push @files, '-f', "$file\@1";
}

my @cmd = (
	'pgbench', '-n', '-c', $clients, '-j', 4, '-T', $seconds,
	@files,
	'-h', $node->host, '-p', $node->port, 'postgres');
note "running: @cmd";
my ($out, $err) = ('', '');
IPC::Run::run(\@cmd, '>', \$out, '2>', \$err, IPC::Run::timeout($seconds + 180));
my $rc = $? >> 8;
note "pgbench stdout:\n$out";
diag "pgbench stderr:\n$err" if $err ne '';

is($rc, 0, 'pgbench exits 0 (no client aborted)');
unlike($err, qr/ERROR|aborted/, 'no unexpected error (IK002 is caught; nothing else may happen)');
like($out, qr/number of failed transactions: 0 \(/, 'no failed transaction');
my ($done) = $out =~ /number of transactions actually processed: (\d+)/;
# how many ran in the time depends on the machine's load: the checks below ask that every kind of
# event happened, not for a number
note "transactions: " . ($done // 'none');

# ---- drain: every lease has run out (max 60 ms); take over and complete what is left
sleep 0.2;
query(q{
DO $$
DECLARE
    r record;
    c idem_claim_result;
BEGIN
    FOR r IN SELECT scope, key FROM idem_keys
              WHERE state = 'pending' OR (state = 'failed' AND retryable) ORDER BY scope, key
    LOOP
        c := idem_claim(r.key, jsonb_build_object('k', split_part(r.key, '-', 2)::int), scope => r.scope);
        IF c.outcome <> 'claimed' OR c.inserted THEN
            RAISE EXCEPTION 'drain: claim of %/% gave %, inserted %', r.scope, r.key, c.outcome, c.inserted;
        END IF;
        INSERT INTO claim_log VALUES (r.scope, r.key, c.outcome, c.inserted, c.attempt, c.state, c.response, c.response_code);
        INSERT INTO biz VALUES (r.scope, r.key, c.attempt, -1);
        PERFORM idem_complete(r.key, jsonb_build_object('client', -1, 'attempt', c.attempt), 201,
                              scope => r.scope, attempt => c.attempt);
    END LOOP;
END
$$;
});

# ---- invariants
query('ANALYZE biz, claim_log, fence_log, idem_keys');
for my $scope (qw(tx lease txwait leasewait))
{
	my $q = sub { my ($sql) = @_; $sql =~ s/:scope/'$scope'/g; return query($sql); };
	my $keys = $q->(q{SELECT count(*) FROM idem_keys WHERE scope = :scope});
	note "$scope: $keys keys; outcomes: "
	  . $q->(q{SELECT string_agg(outcome || '=' || n, ' ') FROM
	             (SELECT outcome, count(*) n FROM claim_log WHERE scope = :scope GROUP BY 1 ORDER BY 1) s})
	  . '; ' . $q->(q{SELECT string_agg(what || '=' || n, ' ') FROM
	             (SELECT what, count(*) n FROM outcome_log WHERE scope = :scope GROUP BY 1 ORDER BY 1) s});
	cmp_ok($keys, '>=', 100, "$scope: at least 100 keys were used ($keys)");
	is($q->(q{SELECT count(*) FROM idem_keys WHERE scope = :scope AND (state = 'pending' OR (state = 'failed' AND retryable))}),
		'0', "$scope: no pending or retryable key is left");
	is($q->(q{SELECT count(*) FROM (SELECT key FROM biz WHERE scope = :scope GROUP BY key HAVING count(*) > 1) d}),
		'0', "$scope: zero duplicates: no key has two business rows");
	is( $q->(q{SELECT count(*) FROM idem_keys k
	            LEFT JOIN (SELECT key, count(*) n FROM biz WHERE scope = :scope GROUP BY key) b ON b.key = k.key
	            WHERE k.scope = :scope AND k.state = 'succeeded' AND coalesce(b.n, 0) <> 1}),
		'0', "$scope: every succeeded key has exactly one business row");
	is( $q->(q{SELECT count(*) FROM biz b
	            WHERE b.scope = :scope AND NOT EXISTS
	                  (SELECT FROM idem_keys k WHERE k.scope = b.scope AND k.key = b.key AND k.state = 'succeeded')}),
		'0', "$scope: no business row without its succeeded key (none for failed keys)");
	is( $q->(q{SELECT count(*) FROM biz b JOIN idem_keys k ON k.scope = b.scope AND k.key = b.key
	            WHERE b.scope = :scope
	              AND (k.attempt <> b.attempt OR k.response_code <> 201
	                   OR k.response <> jsonb_build_object('client', b.client, 'attempt', b.attempt))}),
		'0', "$scope: the business row was written by the attempt that completed the key");
	is( $q->(q{SELECT count(*) FROM claim_log l
	            LEFT JOIN idem_keys k ON k.scope = l.scope AND k.key = l.key
	            WHERE l.scope = :scope AND l.outcome = 'replay'
	              AND (k.key IS NULL OR k.state = 'pending' OR (k.state = 'failed' AND k.retryable)
	                   OR k.state <> l.state OR k.attempt <> l.attempt
	                   OR k.response IS DISTINCT FROM l.response OR k.response_code IS DISTINCT FROM l.response_code)}),
		'0', "$scope: zero lost keys: every replay given to a client is the key's final, stored answer");
	is( $q->(q{SELECT count(*) FROM (SELECT key, attempt FROM claim_log
	                                 WHERE scope = :scope AND outcome = 'claimed'
	                                 GROUP BY key, attempt HAVING count(*) > 1) d}),
		'0', "$scope: no attempt of a key was owned twice");
	is( $q->(q{SELECT count(*) FROM claim_log WHERE scope = :scope AND outcome = 'claimed' AND inserted <> (attempt = 1)}),
		'0', "$scope: inserted is true exactly for attempt 1");
	is( $q->(q{SELECT count(*) FROM idem_keys k
	            LEFT JOIN (SELECT key, max(attempt) AS last, count(*) AS n FROM claim_log
	                        WHERE scope = :scope AND outcome = 'claimed' GROUP BY key) l ON l.key = k.key
	            WHERE k.scope = :scope AND (l.key IS NULL OR k.attempt <> l.last OR k.attempt <> l.n)}),
		'0', "$scope: each key's attempt counts its committed claims exactly (1, 2, ... with no gap)");
	is( $q->(q{SELECT count(*) FROM fence_log f JOIN idem_keys k ON k.scope = f.scope AND k.key = f.key
	            WHERE f.scope = :scope AND f.attempt >= k.attempt}),
		'0', "$scope: only attempts that were taken over were fenced off");
	is( $q->(q{SELECT count(*) FROM claim_log l JOIN idem_keys k ON k.scope = l.scope AND k.key = l.key
	            WHERE l.scope = :scope AND l.outcome = 'in_progress' AND l.attempt > k.attempt}),
		'0', "$scope: in_progress answers report an attempt the key really had");
	is( $q->(q{SELECT count(*) FROM claim_log WHERE scope = :scope AND outcome = 'in_progress' AND state <> 'pending'}),
		'0', "$scope: an in_progress answer with a row shows a pending key");
	is( $q->(q{SELECT count(*) FROM claim_log WHERE scope = :scope
	             AND (attempt IS NULL OR state IS NULL) AND NOT (outcome = 'in_progress' AND attempt IS NULL AND state IS NULL)}),
		'0', "$scope: only an in_progress answer comes without a row, and then with neither attempt nor state");
}
is(query(q{SELECT count(*) FROM claim_log WHERE scope IN ('tx', 'lease') AND attempt IS NULL}), '0',
	'without wait, every answer shows the row (a duplicate waits for the transaction holding the key)');

# mode-specific facts, and proof that the stress did what it says
is(query(q{SELECT count(*) FROM claim_log WHERE scope = 'tx' AND outcome = 'in_progress'}), '0',
	'tx: nobody saw in_progress (a duplicate waits for the transaction that holds the key)');
is(query(q{SELECT count(*) FROM claim_log WHERE scope IN ('tx', 'txwait') AND outcome = 'claimed' AND attempt <> 1}), '0',
	'tx, txwait: no takeover in same-transaction mode (a rolled-back claim leaves nothing to take over)');
is(query(q{SELECT count(*) FROM claim_log WHERE scope = 'txwait' AND outcome = 'in_progress' AND attempt IS NOT NULL}), '0',
	'txwait: every in_progress was behind an uncommitted claim (a committed key here is always finished)');
my %n = map { split /=/ } split /\n/, query(q{
	SELECT 'tx_replays=' || count(*) FILTER (WHERE scope = 'tx' AND outcome = 'replay') FROM claim_log
	UNION ALL SELECT 'tx_rollbacks=' || count(*) FROM outcome_log WHERE scope = 'tx' AND what = 'rollback'
	UNION ALL SELECT 'tx_final_failures=' || count(*) FROM idem_keys WHERE scope = 'tx' AND state = 'failed'
	UNION ALL SELECT 'lease_takeovers=' || count(*) FROM claim_log WHERE scope = 'lease' AND outcome = 'claimed' AND NOT inserted
	UNION ALL SELECT 'lease_in_progress=' || count(*) FROM claim_log WHERE scope = 'lease' AND outcome = 'in_progress'
	UNION ALL SELECT 'lease_fenced=' || count(*) FROM fence_log WHERE scope = 'lease'
	UNION ALL SELECT 'lease_replays=' || count(*) FROM claim_log WHERE scope = 'lease' AND outcome = 'replay'
	UNION ALL SELECT 'lease_rolled_back=' || count(*) FROM outcome_log WHERE scope = 'lease' AND what = 'rolled back'
	UNION ALL SELECT 'lease_abandoned=' || count(*) FROM outcome_log WHERE scope = 'lease' AND what = 'abandoned'
	UNION ALL SELECT 'txwait_replays=' || count(*) FROM claim_log WHERE scope = 'txwait' AND outcome = 'replay'
	UNION ALL SELECT 'txwait_in_progress=' || count(*) FROM claim_log WHERE scope = 'txwait' AND outcome = 'in_progress'
	UNION ALL SELECT 'leasewait_replays=' || count(*) FROM claim_log WHERE scope = 'leasewait' AND outcome = 'replay'
	UNION ALL SELECT 'leasewait_takeovers=' || count(*) FROM claim_log WHERE scope = 'leasewait' AND outcome = 'claimed' AND NOT inserted
	UNION ALL SELECT 'leasewait_in_progress=' || count(*) FROM claim_log WHERE scope = 'leasewait' AND outcome = 'in_progress'
	UNION ALL SELECT 'leasewait_fenced=' || count(*) FROM fence_log WHERE scope = 'leasewait'});
note join(' ', map { "$_=$n{$_}" } sort keys %n);
cmp_ok($n{$_}, '>', 0, "the stress produced $_ ($n{$_})") for sort keys %n;

# A completion racing a takeover of the same key must never get IK003: the key exists all along.
is(query(q{SELECT count(*) || coalesce(': ' || string_agg(DISTINCT message, '; '), '') FROM anomaly_log}),
	'0', 'lease, leasewait: no completion of a claimed key got IK003 (key does not exist)');

# ---- phase 2: stale completions racing with takeovers of one key
query(q{SELECT idem_claim('race', scope => 'race', lease => '1 microsecond')});
my ($take_file, $stale_file) = map { $node->basedir . "/$_.sql" } qw(takeover stale);
PostgreSQL::Test::Utils::append_to_file($take_file,
	q{SELECT 1 FROM idem_claim('race', scope => 'race', lease => '1 microsecond');});
PostgreSQL::Test::Utils::append_to_file($stale_file,
	qq{\\set f random(0, 1)\nSELECT stale_finish(:f = 1);});
@cmd = (
	'pgbench', '-n', '-c', 16, '-j', 4, '-t', 150,
	'-f', "$take_file\@2", '-f', "$stale_file\@1",
	'-h', $node->host, '-p', $node->port, 'postgres');
note "running: @cmd";
($out, $err) = ('', '');
IPC::Run::run(\@cmd, '>', \$out, '2>', \$err, IPC::Run::timeout(180));
$rc = $? >> 8;
note "pgbench stdout:\n$out";
is($rc, 0, 'race: pgbench exits 0');
unlike($err, qr/ERROR|aborted/, 'race: no client error');
my ($takeovers, $stale) = split /\|/, query(q{SELECT attempt - 1, (SELECT count(*) FROM race_log) FROM idem_keys WHERE scope = 'race'});
note "race: $takeovers takeovers, $stale stale completions or failures; "
  . query(q{SELECT string_agg(fn || ' ' || sqlstate || '=' || n, ', ') FROM
             (SELECT fn, sqlstate, count(*) n FROM race_log GROUP BY 1, 2 ORDER BY 1, 2) s});
like($out, qr/number of transactions actually processed: 2400\/2400\b/, 'race: all 2400 transactions ran');
# 2400 transactions drawn 2:1 (each a takeover, or a stale completion or failure), whatever the load
cmp_ok($takeovers, '>=', 1400, 'race: the key was taken over at least 1400 times');
cmp_ok($stale, '>=', 600, 'race: at least 600 stale completions and failures ran');
is(query(q{SELECT count(*) FROM race_log WHERE sqlstate NOT IN ('IK002', 'IK003')}), '0',
	'race: no stale completion or failure succeeded or failed otherwise than IK002/IK003');
is(query(q{SELECT count(*) FROM race_log WHERE sqlstate <> 'IK002'}), '0',
	'race: every stale completion or failure got IK002 (never IK003: the key exists all along)');
is(query(q{SELECT state FROM idem_keys WHERE scope = 'race'}), 'pending', 'race: the key is still pending');

$node->stop;
done_testing();
