# A claim is never delayed by the reaper beyond one batch:
# A. a reap batch held open (idem_reap in an open transaction: the code path of the background
#    reaper's batch): claims, completes and takeovers of other keys, on the same heap and index
#    pages, never wait; a claim of a key the open batch deleted waits for that batch's commit
#    (unique-index semantics, as INSERT ... ON CONFLICT) and then inserts it afresh.
# B. the background reaper running every second over keys that expire all the time, while four
#    clients claim those same keys and new ones with lock_timeout = 1s: no claim fails.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

my $node = PostgreSQL::Test::Cluster->new('concurrency');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_naptime = 1s
idempotency.reaper_enabled = off
});
$node->start;
sub sql { return $node->safe_psql('postgres', $_[0]); }
sql('CREATE EXTENSION idempotency');

# ---- A. a batch held open
# expired keys (old-even) interleaved with live ones (live-odd): the same heap and index pages
sql(q{
	SELECT idem_claim(CASE WHEN g % 2 = 0 THEN 'old-' ELSE 'live-' END || lpad(g::text, 4, '0'),
	                  ttl   => CASE WHEN g % 2 = 0 THEN interval '1 millisecond' ELSE interval '1 hour' END,
	                  lease => CASE WHEN g % 2 = 0 THEN interval '1 millisecond' ELSE interval '1 hour' END)
	FROM generate_series(1, 400) g;
});
sleep 0.05;

my $reaper = $node->background_psql('postgres');
$reaper->query_safe('BEGIN');
is($reaper->query_safe('SELECT idem_reap(50)'), 50, 'an open batch deleted 50 expired keys');
my $deleted = $reaper->query_safe(q{
	SELECT min(k) FROM (SELECT 'old-' || lpad(g::text, 4, '0') AS k FROM generate_series(2, 400, 2) g) s
	WHERE NOT EXISTS (SELECT 1 FROM idem_keys WHERE key = s.k)});
my $kept = $reaper->query_safe(q{
	SELECT max(k) FROM (SELECT 'old-' || lpad(g::text, 4, '0') AS k FROM generate_series(2, 400, 2) g) s
	WHERE EXISTS (SELECT 1 FROM idem_keys WHERE key = s.k)});
note("the open batch deleted $deleted; $kept is expired but not in the batch");

# every one of these runs while the batch is open, with lock_timeout = 1s: none may wait (a wait
# would end in a lock timeout error, whatever the machine's load)
my $t0 = time;
my ($rc, $out, $err) = $node->psql('postgres', qq{
	SET lock_timeout = '1s';
	SELECT (idem_claim('live-0001')).outcome;                                  -- same page, in progress
	SELECT state FROM idem_complete('live-0003', '{"ok": true}');              -- same page, an update
	SELECT (idem_claim('live-0003')).outcome;                                  -- replay
	SELECT count(*) FROM (SELECT idem_claim('fresh-' || g) FROM generate_series(1, 100) g) s; -- inserts
	SELECT (idem_claim('$kept')).outcome, (idem_claim('$kept')).attempt;       -- an expired key, claimed anew
	SELECT idem_reap(10);                                                      -- a second reaper skips locked rows
}, on_error_stop => 1);
my $took = time - $t0;
is($rc, 0, 'claims, completes, takeovers and reaps of other keys on the same pages do not wait') or diag $err;
is($out, "in_progress\nsucceeded\nreplay\n100\nclaimed|1\n10", 'with the expected outcomes');
note sprintf('all within %.2f s', $took);

# the deleted key: waits for the open batch (lock_timeout says so)...
($rc, $out, $err) = $node->psql('postgres', qq{SET lock_timeout = '500ms'; SELECT idem_claim('$deleted')});
like($err, qr/canceling statement due to lock timeout/, 'a claim of a key the open batch deleted waits for it');
# ... and completes as soon as the batch commits
my $claimer = $node->background_psql('postgres');
$claimer->query_until(qr/started/, qq{\\echo started\nSELECT outcome || '|' || inserted FROM idem_claim('$deleted');\n});
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 1 FROM pg_stat_activity
	WHERE query LIKE '%idem_claim(''$deleted'')%' AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()}),
	'the claim waits on the open batch (a transaction lock)');
my $t1 = time;
$reaper->query_safe('COMMIT');
my $result = $claimer->query_until(qr/\n/, '');
chomp $result;
my $after = time - $t1;
is($result, 'claimed|true', 'after the batch commits the claim inserts the key afresh');
note sprintf('%.2f s after the commit', $after);
$claimer->quit;
$reaper->quit;

# ---- B. the background reaper at work while clients claim the keys it deletes
sql(q{ALTER SYSTEM SET idempotency.reaper_enabled = on});
sql(q{ALTER SYSTEM SET idempotency.reaper_batch_size = 20});
sql(q{ALTER DATABASE postgres SET lock_timeout = '1s'});
$node->reload;
ok($node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency reaper'"), 'the reaper runs');
my $before = sql('SELECT reaped FROM idem_stats');
my $log_offset = -s $node->logfile;
$node->pgbench('--no-vacuum --client=4 --jobs=4 --time=5', 0,
	[qr{processed: \d+}], [qr{^(?!.*(ERROR|aborted))}s],
	'4 clients claiming keys that expire and get reaped all the time, lock_timeout = 1s: no error',
	{ '014_claims' => q{
\set k random(1, 300)
SELECT idem_claim('churn-' || :k, ttl => '5 milliseconds', lease => '5 milliseconds');
\set r random(1, 1000000000)
SELECT idem_claim('new-' || :client_id || '-' || :r);
} });
my $reaped = sql('SELECT reaped FROM idem_stats') - $before;
cmp_ok($reaped, '>', 0, "the reaper deleted $reaped keys meanwhile");
ok(!$node->log_contains(qr/lock timeout|deadlock/, $log_offset), 'no lock timeout or deadlock in the log');

$node->stop;
done_testing();
