# Immediate shutdown (pg_ctl stop -m immediate: no shutdown checkpoint, crash recovery at the next
# start) with keys in every state: all committed state survives, byte for byte.
#
# Keys: pending with a live lease, pending with an expired lease, succeeded, failed retryable,
# failed terminal, taken over twice, expired by ttl, with request fingerprints and explicit
# fingerprints, in three scopes, with small, nested and TOASTed (2 MB) responses.  Beside them:
# an open transaction (a new claim and a completion, never committed) and two prepared
# transactions (two-phase commit: a new key claimed and completed; a takeover), which survive the
# restart as prepared transactions.
#
# Round 1 stops right after the keys were written (no checkpoint since); round 2 stops after a
# checkpoint and a second wave of changes (completions, failures, takeovers, reaping).  After each
# start, a full dump of idem_keys ordered by (scope, key) is identical to the one taken before the
# stop, the indexes pass amcheck, every state behaves as it should, and the prepared transactions
# still hold their rows; COMMIT PREPARED / ROLLBACK PREPARED then finish them.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('immediate');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
# nothing may change the keys behind the test's back
idempotency.reaper_enabled = off
max_prepared_transactions = 5
fsync = on
log_statement = none
});
$node->start;

sub query { return $node->safe_psql('postgres', $_[0]); }

# every column, timestamps to the microsecond; big responses by length and md5
my $dump_sql = q{
SELECT concat_ws('|', scope, key, state, attempt, encode(fingerprint, 'hex'),
                 CASE WHEN length(response::text) > 1000
                      THEN 'len=' || length(response::text) || ',md5=' || md5(response::text)
                      ELSE response::text END,
                 response_code, retryable,
                 to_char(created_at, 'YYYY-MM-DD HH24:MI:SS.US'),
                 to_char(locked_until, 'YYYY-MM-DD HH24:MI:SS.US'),
                 to_char(completed_at, 'YYYY-MM-DD HH24:MI:SS.US'),
                 to_char(expires_at, 'YYYY-MM-DD HH24:MI:SS.US'))
  FROM idem_keys ORDER BY scope, key};

sub amcheck_ok
{
	my ($what) = @_;
	like( query(q{SELECT string_agg(c.relname, ',' ORDER BY c.relname)
		          FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam
		          CROSS JOIN LATERAL bt_index_check(c.oid, true)
		         WHERE i.indrelid = 'idem_keys'::regclass AND am.amname = 'btree'}),
		qr/\bidem_keys_pkey\b/,
		"$what: amcheck: the btree indexes of idem_keys (the primary key among them) match the heap");
}

# Stop immediately and start again; the dump must not change.
sub immediate_restart
{
	my ($round) = @_;
	my $before = query($dump_sql);
	my $n = () = $before =~ /\n/g;
	note "round $round: " . ($n + 1) . " keys before the immediate shutdown";
	my $logstart = -s $node->logfile;
	$node->stop('immediate');
	$node->start;
	ok($node->log_contains(qr/database system was interrupted|was not properly shut down/, $logstart),
		"round $round: the start ran crash recovery");
	my $after = query($dump_sql);
	ok($before eq $after, "round $round: the dump of idem_keys is identical after the restart");
	if ($before ne $after)
	{
		my %b = map { $_ => 1 } split /\n/, $before;
		my %a = map { $_ => 1 } split /\n/, $after;
		diag "lost: $_" for grep { !$a{$_} } sort keys %b;
		diag "new or changed: $_" for grep { !$b{$_} } sort keys %a;
	}
	amcheck_ok("round $round");
	return $after;
}

query(q{CREATE EXTENSION idempotency; CREATE EXTENSION amcheck;});

# ---- round 1: keys in every state
query(q{
-- scopes '', 'tenant a', 'POST /payments'; 200 keys of each kind per scope
CREATE TEMP TABLE s(scope text);
INSERT INTO s VALUES (''), ('tenant a'), ('POST /payments');

-- pending, live lease
SELECT idem_claim('live-' || g, jsonb_build_object('n', g), scope => s.scope, lease => '1 hour')
  FROM s, generate_series(1, 200) g;
-- pending, expired lease
SELECT idem_claim('lapsed-' || g, jsonb_build_object('n', g), scope => s.scope, lease => '1 millisecond')
  FROM s, generate_series(1, 200) g;
-- succeeded, with nested and unicode responses
SELECT idem_claim('ok-' || g, jsonb_build_object('n', g), scope => s.scope) FROM s, generate_series(1, 200) g;
SELECT idem_complete('ok-' || g,
                     jsonb_build_object('id', g, 'items', jsonb_build_array(1, 'two', null, true),
                                        'note', 'café ☕ ' || g, 'nested', jsonb_build_object('a', jsonb_build_object('b', g))),
                     200 + g % 3, scope => s.scope, attempt => 1)
  FROM s, generate_series(1, 200) g;
-- failed, retryable / terminal
SELECT idem_claim('failr-' || g, scope => s.scope) FROM s, generate_series(1, 200) g;
SELECT idem_fail('failr-' || g, jsonb_build_object('error', 'provider down'), 503, true, scope => s.scope)
  FROM s, generate_series(1, 200) g;
SELECT idem_claim('failt-' || g, scope => s.scope) FROM s, generate_series(1, 200) g;
SELECT idem_fail('failt-' || g, jsonb_build_object('error', 'card declined'), 402, false, scope => s.scope)
  FROM s, generate_series(1, 200) g;
-- explicit fingerprints, no response (fail with NULL response)
SELECT idem_claim('fp-' || g, fingerprint => decode(md5(g::text), 'hex'), scope => s.scope, lease => '1 hour')
  FROM s, generate_series(1, 200) g;
SELECT idem_fail('fp-' || g, NULL, 500, false, scope => s.scope) FROM s, generate_series(1, 100) g;
-- expired by ttl (still there: no reaper), finished and pending; the finished ones are completed
-- while their lease is live (an expired key cannot be completed), and expire with that
SELECT idem_claim('ttl-' || g, scope => s.scope, ttl => '1 millisecond', lease => '1 hour')
  FROM s, generate_series(1, 100) g;
SELECT idem_complete('ttl-' || g, '"done"', scope => s.scope) FROM s, generate_series(1, 100) g;
SELECT idem_claim('ttl-' || g, scope => s.scope, ttl => '1 millisecond', lease => '1 millisecond')
  FROM s, generate_series(101, 200) g;
});
# taken over twice (attempt 3), then the third owner succeeds for half of them
query(q{
SELECT idem_claim('taken-' || g, '{"x": 1}', lease => '1 millisecond') FROM generate_series(1, 200) g;
SELECT pg_sleep(0.01);
SELECT idem_claim('taken-' || g, '{"x": 1}', lease => '1 millisecond') FROM generate_series(1, 200) g;
SELECT pg_sleep(0.01);
SELECT idem_claim('taken-' || g, '{"x": 1}', lease => '1 hour') FROM generate_series(1, 200) g;
SELECT idem_complete('taken-' || g, jsonb_build_object('by', 3), attempt => 3) FROM generate_series(1, 100) g;
});
# a TOASTed response (2 MB)
query(q{
SELECT idem_claim('big', '{"big": true}');
SELECT idem_complete('big', jsonb_build_object('blob', repeat('0123456789abcdef', 131072)), 201);
});
is(query(q{SELECT state || ',' || length(response->>'blob') FROM idem_keys WHERE key = 'big'}),
	'succeeded,2097152', 'a 2 MB response is stored');
is( query(q{SELECT string_agg(state || (CASE WHEN retryable THEN '/retryable' WHEN NOT retryable THEN '/final' ELSE '' END)
                              || '=' || n, ' ' ORDER BY state, retryable)
              FROM (SELECT state, retryable, count(*) n FROM idem_keys GROUP BY 1, 2) s}),
	'pending=1900 succeeded=1001 failed/final=900 failed/retryable=600',
	'keys in every state');

# an open transaction that will never commit, and two prepared transactions
my $open = $node->background_psql('postgres');
$open->query_safe(q{BEGIN;
	SELECT idem_claim('uncommitted');
	SELECT idem_complete('live-1', '"uncommitted completion"', attempt => 1);});
query(q{BEGIN;
	SELECT idem_claim('prepared-new', '{"p": 1}');
	SELECT idem_complete('prepared-new', '{"p": "done"}', 201, attempt => 1);
	PREPARE TRANSACTION 'p_new';});
query(q{BEGIN;
	SELECT idem_claim('lapsed-1', '{"n": 1}', lease => '1 hour');
	PREPARE TRANSACTION 'p_takeover';});

immediate_restart(1);
$open->{run}->kill_kill;    # its server is gone

is( query(q{SELECT string_agg(gid, ',' ORDER BY gid) FROM pg_prepared_xacts}), 'p_new,p_takeover',
	'both prepared transactions survived');
is(query(q{SELECT count(*) FROM idem_keys WHERE key IN ('uncommitted', 'prepared-new')}), '0',
	'the uncommitted and the prepared claims are not visible');
is(query(q{SELECT state || ',' || attempt || ',' || (response IS NULL) FROM idem_keys WHERE scope = '' AND key = 'live-1'}),
	'pending,1,true', 'the uncommitted completion of live-1 is gone');
is(query(q{SELECT state || ',' || attempt FROM idem_keys WHERE scope = '' AND key = 'lapsed-1'}),
	'pending,1', 'the prepared takeover of lapsed-1 is not visible');
# the prepared transactions still hold their rows: a claim waits for them
my ($rc, $out, $err) = $node->psql('postgres',
	q{SET lock_timeout = '300ms'; SELECT idem_claim('lapsed-1', '{"n": 1}')});
like($err, qr/lock timeout/, 'a claim of lapsed-1 waits for the prepared takeover (lock timeout)');
($rc, $out, $err) = $node->psql('postgres',
	q{SET lock_timeout = '300ms'; SELECT idem_claim('prepared-new', '{"p": 1}')});
like($err, qr/lock timeout/, 'a claim of prepared-new waits for the prepared insert (lock timeout)');

# ---- the states behave after the restart
is(query(q{SELECT outcome || ',' || attempt FROM idem_claim('live-2', '{"n": 2}')}),
	'in_progress,1', 'pending with a live lease: in_progress');
is(query(q{SELECT outcome || ',' || inserted || ',' || attempt FROM idem_claim('lapsed-2', '{"n": 2}')}),
	'claimed,false,2', 'pending with an expired lease: taken over');
like(query(q{SELECT outcome || ',' || response_code || ',' || (response->>'note') FROM idem_claim('ok-7', '{"n": 7}', scope => 'tenant a')}),
	qr/^replay,201,café ☕ 7$/, 'succeeded: replays the stored response');
is(query(q{SELECT outcome || ',' || attempt FROM idem_claim('failr-3')}),
	'claimed,2', 'failed retryable: taken over');
is(query(q{SELECT outcome || ',' || state || ',' || response_code FROM idem_claim('failt-3', scope => 'POST /payments')}),
	'replay,failed,402', 'failed terminal: replays the error');
($rc, $out, $err) = $node->psql('postgres', q{SELECT idem_claim('ok-1', '{"n": 2}')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:\s+IK001:/, 'a different request still gets IK001');
($rc, $out, $err) = $node->psql('postgres', q{SELECT idem_claim('fp-1', fingerprint => '\x01')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:\s+IK001:/, 'a different explicit fingerprint still gets IK001');
is(query(q{SELECT outcome || ',' || attempt FROM idem_claim('fp-150', fingerprint => decode(md5('150'), 'hex'))}),
	'in_progress,1', 'the same explicit fingerprint matches');
is(query(q{SELECT md5(response->>'blob') = md5(repeat('0123456789abcdef', 131072)) FROM idem_lookup('big')}),
	't', 'the 2 MB response reads back intact');
is(query(q{SELECT outcome || ',' || attempt || ',' || (response->>'by') FROM idem_claim('taken-5', '{"x": 1}')}),
	'replay,3,3', 'a key taken over twice replays its third attempt');

# ---- round 2: a checkpoint, then a second wave of changes, then stop again
query('CHECKPOINT');
query(q{
SELECT idem_complete('live-' || g, jsonb_build_object('done', g), 200, attempt => 1)
  FROM generate_series(3, 100) g;                                     -- pending -> succeeded
SELECT idem_fail('live-' || g, NULL, 503, true) FROM generate_series(101, 150) g;   -- -> failed
SELECT idem_claim('lapsed-' || g, jsonb_build_object('n', g)) FROM generate_series(3, 100) g;  -- takeover
SELECT idem_claim('failr-' || g) FROM generate_series(4, 100) g;       -- takeover of failed keys
SELECT idem_complete('failr-' || g, '"second time lucky"', attempt => 2) FROM generate_series(4, 50) g;
SELECT idem_reap(250);                                                 -- some ttl- keys go
});
is(query(q{SELECT count(*) FROM idem_keys WHERE key LIKE 'ttl-%'}), '350', 'idem_reap deleted 250 expired keys');
query(q{BEGIN;
	SELECT idem_claim('prepared-2', '{"p": 2}', lease => '1 hour');
	PREPARE TRANSACTION 'p_second';});

immediate_restart(2);

is( query(q{SELECT string_agg(gid, ',' ORDER BY gid) FROM pg_prepared_xacts}), 'p_new,p_second,p_takeover',
	'the three prepared transactions survived');

# ---- finish the prepared transactions
query(q{COMMIT PREPARED 'p_new'});
is( query(q{SELECT outcome || ',' || state || ',' || (response->>'p') FROM idem_claim('prepared-new', '{"p": 1}')}),
	'replay,succeeded,done', 'COMMIT PREPARED: the key claimed and completed before the restarts is there');
query(q{ROLLBACK PREPARED 'p_takeover'});
is(query(q{SELECT outcome || ',' || inserted || ',' || attempt FROM idem_claim('lapsed-1', '{"n": 1}')}),
	'claimed,false,2', 'ROLLBACK PREPARED: the takeover is undone; the next claim takes it over with attempt 2');
query(q{COMMIT PREPARED 'p_second'});
is(query(q{SELECT outcome || ',' || attempt FROM idem_claim('prepared-2', '{"p": 2}')}),
	'in_progress,1', 'COMMIT PREPARED of a claim: the key is pending and its lease live');

amcheck_ok('at the end');
$node->stop;
done_testing();
