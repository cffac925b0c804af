# Streaming replication and failover.
#
# A primary and a hot standby with synchronous replication (synchronous_standby_names names the
# standby's application_name, synchronous_commit = on: a COMMIT returns once the standby has
# flushed its WAL).
#
# On the standby: idem_lookup and idem_stats work and see what the primary committed;
# idem_claim, idem_complete, idem_fail, idem_reap and idem_reap_all fail with SQLSTATE 25006 and
# a message that names the function, whatever the state of the key, and change nothing.
#
# Failover: while a client commits keys on the primary (same-transaction mode with a business
# row, and lease-mode claims) and prints each one after its COMMIT returned, the primary is
# stopped in immediate mode and the standby promoted.  On the new primary: every key the old
# primary acknowledged is there in the state it was acknowledged in, with its business row; the
# keys written before are identical; claims, takeovers and completions work; the background
# reaper (launcher and reaper in pg_stat_activity) starts and deletes the expired keys.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time sleep);

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
# The primary's reaper is off, so that expired keys reach the standby and are still there for
# the promoted standby's reaper to delete.
$primary->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_enabled = off
idempotency.reaper_naptime = 1s
synchronous_commit = on
log_statement = none
});
$primary->start;

sub on_primary { return $primary->safe_psql('app', $_[0]); }

$primary->safe_psql('postgres', 'CREATE DATABASE app');
on_primary(q{
CREATE EXTENSION idempotency;
CREATE TABLE orders (key text NOT NULL, client text NOT NULL);
-- keys in every state
SELECT idem_claim('live-' || g, jsonb_build_object('n', g), lease => '1 hour') FROM generate_series(1, 50) g;
SELECT idem_claim('lapsed-' || g, jsonb_build_object('n', g), lease => '1 millisecond') FROM generate_series(1, 50) g;
SELECT idem_claim('ok-' || g, jsonb_build_object('n', g), scope => 'tenant a') FROM generate_series(1, 50) g;
SELECT idem_complete('ok-' || g, jsonb_build_object('id', g), 201, scope => 'tenant a') FROM generate_series(1, 50) g;
SELECT idem_claim('failr-' || g) FROM generate_series(1, 50) g;
SELECT idem_fail('failr-' || g, '{"error": "timeout"}', 504, true) FROM generate_series(1, 50) g;
SELECT idem_claim('failt-' || g) FROM generate_series(1, 50) g;
SELECT idem_fail('failt-' || g, '{"error": "declined"}', 402, false) FROM generate_series(1, 50) g;
-- expired (ttl 1 ms): for the new primary's reaper
-- (completed while their lease is live: an expired key cannot be completed)
SELECT idem_claim('exp-' || g, ttl => '1 millisecond', lease => '1 hour') FROM generate_series(1, 50) g;
SELECT idem_complete('exp-' || g, '"old"') FROM generate_series(1, 50) g;
SELECT idem_claim('exp-' || g, ttl => '1 millisecond', lease => '1 millisecond') FROM generate_series(51, 100) g;
});

my $dump_sql = q{SELECT concat_ws('|', scope, key, state, attempt, encode(fingerprint, 'hex'), response,
                                  response_code, retryable, created_at, locked_until, completed_at, expires_at)
                   FROM idem_keys ORDER BY scope, key};

$primary->backup('bk');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'bk', has_streaming => 1);
$standby->append_conf('postgresql.conf', 'idempotency.reaper_enabled = on');
$standby->start;

# synchronous replication to the standby (its application_name is its cluster_name, 'standby')
on_primary(q{ALTER SYSTEM SET synchronous_standby_names = 'standby'});
$primary->reload;
ok($primary->poll_query_until('postgres',
	q{SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = 'standby'}),
	'the standby is a synchronous standby');
$primary->wait_for_catchup($standby);

# ---- the hot standby
sub on_standby { return $standby->safe_psql('app', $_[0]); }
is(on_standby('SELECT pg_is_in_recovery()'), 't', 'the standby is in recovery');
is(on_standby($dump_sql), on_primary($dump_sql), 'the standby has the primary\'s keys, identical');
is(on_standby(q{SELECT state || ',' || attempt || ',' || response_code || ',' || (response->>'id')
                FROM idem_lookup('ok-7', scope => 'tenant a')}),
	'succeeded,1,201,7', 'idem_lookup works on the standby');
is(on_standby(q{SELECT idem_lookup('no-such-key') IS NULL}), 't', 'idem_lookup of a missing key: NULL');
is(on_standby(q{SELECT claims IS NOT NULL FROM idem_stats}), 't', 'idem_stats answers on the standby');

# every writing function, on keys in every state: 25006, a message naming the function
my @writers = (
	[ 'idem_claim() of a new key',      q{SELECT idem_claim('new-on-standby')},                      'idem_claim' ],
	[ 'idem_claim() of a succeeded key', q{SELECT idem_claim('ok-1', '{"n": 1}', scope => 'tenant a')}, 'idem_claim' ],
	[ 'idem_claim() of a pending key',   q{SELECT idem_claim('live-1', '{"n": 1}')},                  'idem_claim' ],
	[ 'idem_claim() of a lapsed key',    q{SELECT idem_claim('lapsed-1', '{"n": 1}')},                'idem_claim' ],
	[ 'idem_complete()',                 q{SELECT idem_complete('live-2', '{}')},                     'idem_complete' ],
	[ 'idem_complete() of a missing key', q{SELECT idem_complete('no-such-key', '{}')},               'idem_complete' ],
	[ 'idem_fail()',                     q{SELECT idem_fail('live-3')},                               'idem_fail' ],
	[ 'idem_reap()',                     q{SELECT idem_reap()},                                       'idem_reap' ],
	[ 'idem_reap(1)',                    q{SELECT idem_reap(1)},                                      'idem_reap' ],
	[ 'CALL idem_reap_all()',            q{CALL idem_reap_all()},                                     'idem_reap' ]);
for my $w (@writers)
{
	my ($what, $sql, $fn) = @$w;
	my ($rc, $out, $err) = $standby->psql('app', $sql, extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	isnt($rc, 0, "standby: $what fails");
	like($err, qr/ERROR:\s+25006: cannot execute $fn\(\) in a read-only transaction/,
		"standby: $what: SQLSTATE 25006, message names $fn()");
}
is(on_standby($dump_sql), on_primary($dump_sql), 'nothing changed on the standby');
is( $standby->safe_psql('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency%'}),
	'0', 'no background reaper on the standby');

# ---- failover during a workload
# One client, one transaction at a time, "ack <key> <state>" after each COMMIT returned:
#   tx-<i>:    BEGIN; claim; business row; complete; COMMIT          -> succeeded
#   lease-<i>: claim with a one-hour lease (autocommit)              -> pending, attempt 1
#   lapsed-<i> (i <= 50): take over the lapsed key, complete it with attempt 2 -> succeeded
my $script = $primary->basedir . '/acker.sql';
open(my $fh, '>', $script) or die "cannot write $script: $!";
for my $i (1 .. 5000)
{
	print $fh qq{BEGIN;
SELECT 1 FROM idem_claim('tx-$i', '{"i": $i}') WHERE outcome = 'claimed';
INSERT INTO orders VALUES ('tx-$i', 'acker');
SELECT 1 FROM idem_complete('tx-$i', '{"order": $i}', 201, attempt => 1);
COMMIT;
\\echo ack tx-$i succeeded
SELECT 1 FROM idem_claim('lease-$i', '{"i": $i}', lease => '1 hour') WHERE outcome = 'claimed';
\\echo ack lease-$i pending
};
	if ($i <= 50)
	{
		print $fh qq{SELECT 1 FROM idem_claim('lapsed-$i', '{"n": $i}') WHERE outcome = 'claimed' AND attempt = 2;
SELECT 1 FROM idem_complete('lapsed-$i', '{"late": true}', attempt => 2);
\\echo ack lapsed-$i succeeded
};
	}
}
close $fh;
my $before_failover = on_primary($dump_sql);
my ($ack_out, $ack_err) = ('', '');
my $acker = IPC::Run::start(
	[
		'psql', '-X', '-q', '-A', '-t', '-v', 'ON_ERROR_STOP=1', '-f', $script,
		'-d', $primary->connstr('app')
	],
	'<', \undef, '>', \$ack_out, '2>', \$ack_err,
	IPC::Run::timeout(180));
# let it commit for a while (at least 200 acknowledged transactions)
my $t0 = time;
while (time - $t0 < 60)
{
	$acker->pump_nb;
	my @n = $ack_out =~ /^ack /mg;
	last if @n >= 200 && time - $t0 >= 1;
	sleep 0.05;
}
$primary->stop('immediate');
$acker->finish;
unlike($ack_err, qr/ERROR:/, 'the client saw no SQL error before the primary went away');
my %acked = $ack_out =~ /^ack (\S+) (\S+)$/mg;
note 'acknowledged before the failover: ' . scalar(keys %acked);
cmp_ok(scalar(keys %acked), '>=', 200, 'the primary acknowledged at least 200 commits before it stopped');

$standby->promote;
ok($standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()'), 'the standby is promoted');

# ---- the new primary has every acknowledged key
my $state_list = on_standby(q{SELECT string_agg(key || ' ' || state || ' ' || attempt, E'\n') FROM idem_keys
                              WHERE key LIKE 'tx-%' OR key LIKE 'lease-%' OR key LIKE 'lapsed-%'});
my %have = map { my ($k, $s, $a) = split / /; ($k => "$s $a") } split /\n/, $state_list;
my @missing = grep {
	my $want = $acked{$_} eq 'succeeded' && /^lapsed-/ ? 'succeeded 2'
	  : $acked{$_} eq 'succeeded' ? 'succeeded 1' : 'pending 1';
	($have{$_} // 'missing') ne $want
} sort keys %acked;
is(join(' ', @missing[0 .. ($#missing < 9 ? $#missing : 9)]), '',
	'every acknowledged key is on the new primary in its acknowledged state');
my $tx_acked = join(',', map { "'$_'" } grep { /^tx-/ } keys %acked);
my $n_tx = grep { /^tx-/ } keys %acked;
is(on_standby(qq{SELECT count(*) || ',' || count(DISTINCT key) FROM orders WHERE key IN ($tx_acked)}),
	"$n_tx,$n_tx", 'with exactly one business row each');
is(on_standby(q{SELECT count(*) FROM (SELECT key FROM orders GROUP BY key HAVING count(*) > 1) d}), '0',
	'no duplicate business row at all');
is( on_standby(q{SELECT count(*) FROM orders o WHERE NOT EXISTS
                   (SELECT FROM idem_keys k WHERE k.key = o.key AND k.state = 'succeeded')}),
	'0', 'no business row without its succeeded key');
# the keys written before the workload and not touched by it (all but lapsed-1 .. lapsed-50, and
# the expired keys, which the new primary's reaper may already be deleting) are identical
my @untouched = grep {
	my ($scope, $key) = split /\|/;
	!($key =~ /^lapsed-(\d+)$/ && $1 <= 50) && $key !~ /^exp-/
} split /\n/, $before_failover;
is(scalar(@untouched), 200, '200 keys (live, ok, failr, failt) were not touched by the workload');
my %after = map { $_ => 1 } split /\n/, on_standby($dump_sql);
is(join("\n", grep { !$after{$_} } @untouched), '', 'the keys committed before the workload are identical');

# ---- the new primary works
is(on_standby(q{SELECT outcome || ',' || inserted || ',' || attempt FROM idem_claim('after-failover', '{"a": 1}')}),
	'claimed,true,1', 'a new key is claimed on the new primary');
is(on_standby(q{SELECT state FROM idem_complete('after-failover', '{"ok": true}', attempt => 1)}),
	'succeeded', 'and completed');
like(on_standby(q{SELECT outcome || ',' || response_code FROM idem_claim('ok-3', '{"n": 3}', scope => 'tenant a')}),
	qr/^replay,201$/, 'a key succeeded on the old primary replays');
is(on_standby(q{SELECT outcome || ',' || attempt FROM idem_claim('live-4', '{"n": 4}')}),
	'in_progress,1', 'a lease taken on the old primary is still live');
is(on_standby(q{SELECT outcome || ',' || inserted || ',' || attempt FROM idem_claim('failr-4')}),
	'claimed,false,2', 'a retryable failure from the old primary is taken over');
my ($rc, $out, $err) = $standby->psql('app', q{SELECT idem_complete('failr-4', '{}', attempt => 1)},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:\s+IK002:/, 'and the old attempt is fenced off (IK002)');

# ---- the reaper starts after promotion and reaps
ok($standby->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'}),
	'after promotion the launcher runs');
ok($standby->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency reaper' AND datname = 'app'}),
	'and a reaper in the database with the extension');
ok($standby->poll_query_until('app', q{SELECT count(*) = 0 FROM idem_keys WHERE key LIKE 'exp-%'}),
	'the expired keys are reaped');
is(on_standby(q{SELECT count(*) FROM idem_keys WHERE key LIKE 'live-%' OR key LIKE 'ok-%'}), '100',
	'the live keys stay');

$standby->stop;
done_testing();
