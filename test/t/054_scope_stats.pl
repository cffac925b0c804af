# idem_scope_stats across the server's life: the bound idempotency.track_scopes holds with least
# used eviction counted in idem_stats.dealloc, a busy scope outlives a churn of one-claim scopes,
# retry_after_s converges on the scope's work time (a worker taking 2 s a job), tracking off and a
# short lease bound it, and a restart empties the statistics. Exact counters per outcome, the
# visibility rules and the reset: sql/scope_stats.sql.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

my $node = PostgreSQL::Test::Cluster->new('scope_stats');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_enabled = off
idempotency.track_scopes = 10
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
sub sql { return $node->safe_psql('postgres', shift) }

# ---- the bound and eviction
# A busy scope first (50 claims and completes), then 25 scopes of one claim each.
sql(q{SELECT idem_claim('h-' || g, scope => 'hot'), idem_complete('h-' || g, '{}', scope => 'hot')
      FROM generate_series(1, 50) g});
sql(qq{SELECT idem_claim('k', scope => 'cold-$_')}) for 1 .. 25;
is(sql(q{SELECT count(*) FROM idem_scope_stats}), 10, 'the bound holds: 10 entries for 26 scopes');
is(sql(q{SELECT dealloc FROM idem_stats}), 16, 'each of the 16 evictions counted in idem_stats.dealloc');
is(sql(q{SELECT claims || ',' || completes FROM idem_scope_stats WHERE scope = 'hot'}), '50,50',
	'the busy scope outlived the churn, its counts whole');
is(sql(q{SELECT count(*) FROM idem_scope_stats WHERE scope = 'cold-25'}), 1,
	'the newest scope is there');
# an evicted scope that comes back starts from zero
is(sql(q{SELECT claims FROM idem_scope_stats WHERE scope = 'cold-1'}), '', 'cold-1 was evicted');
sql(q{SELECT idem_claim('k', scope => 'cold-1')});
is(sql(q{SELECT claims || ',' || in_progress FROM idem_scope_stats WHERE scope = 'cold-1'}), '1,1',
	'an evicted scope counts anew when it comes back');
sql(q{SELECT idem_stats_reset()});
is(sql(q{SELECT dealloc FROM idem_stats}), 0, 'idem_stats_reset zeroes dealloc');
sql(q{SELECT idem_scope_stats_reset()});
is(sql(q{SELECT count(*) FROM idem_scope_stats}), 0, 'idem_scope_stats_reset empties the view');

# ---- the batch calls count per key, as the single calls do
sql(q{SELECT idem_claim('b-old', scope => 'batch'); SELECT idem_complete('b-old', '{}', scope => 'batch')});
sql(q{SELECT idem_scope_stats_reset()});
sql(q{BEGIN;
      SELECT count(*) FROM idem_claim_batch(ARRAY['b-1', 'b-2', 'b-old', 'b-3', 'b-2'], 'batch');
      SELECT idem_complete_batch(ARRAY['b-3', 'b-1', 'b-2'], 'batch');
      COMMIT});
is(sql(q{SELECT concat_ws(',', claims, inserted, replays, completes, p50_ms IS NOT NULL)
         FROM idem_scope_stats WHERE scope = 'batch'}), '4,3,1,3,t',
	'a batch of 4 distinct keys (one finished before): 4 claims, 3 inserted, 1 replay, 3 completes with their work times');
sql(q{SELECT idem_scope_stats_reset()});

# ---- retry_after_s from the scope's work time
# Before any finished attempt: the lease left (60 s by default).
sql(q{SELECT idem_claim('job-0', scope => 'work')});
# (at least 50: the machine may be slow between two statements, and the estimate would be 1 to 3)
cmp_ok(sql(q{SELECT retry_after_s FROM idem_claim('job-0', scope => 'work')}), '>=', 50,
	'no work time known yet: ceil(retry_after), the lease left');
sql(q{SELECT idem_complete('job-0', '{}', scope => 'work')});
# A worker that takes about 2 s per job (claim, work, complete, each statement its own
# transaction), 5 jobs. The work times are what the table says: claimed_at to completed_at (a
# loaded machine stretches some of them: the checks compare with the table's own times, never with
# the 1.9 s asked for). A percentile is the middle of its histogram bucket (±10 %), and the
# estimate is rounded up to whole seconds: both stay within the 1 s checked below.
for my $i (1 .. 5)
{
	sql(qq{SELECT idem_claim('job-$i', scope => 'work');
	       SELECT pg_sleep(1.9);
	       SELECT idem_complete('job-$i', '{}', scope => 'work')});
}
# the same rank as the statistics take (ceil(0.9 n)), over the same attempts (job-0 included)
my $work_p90_s = sql(q{SELECT percentile_disc(0.9) WITHIN GROUP (ORDER BY date_part('epoch', completed_at - claimed_at))
                       FROM idem_keys WHERE scope = 'work'});
my ($p50, $p90) = split /\|/, sql(q{SELECT p50_ms, p90_ms FROM idem_scope_stats WHERE scope = 'work'});
cmp_ok(abs($p90 / 1000 - $work_p90_s), '<=', 1, "p90 ($p90 ms) within 1 s of the table's ($work_p90_s s)");
# A duplicate 0.5 s into a job: a retry is useful when the job is likely done, at claimed_at + p90.
sql(q{SELECT idem_claim('job-6', scope => 'work')});
sleep 0.5;
my ($retry_after_s, $remaining) = split /\|/, sql(qq{
	SELECT c.retry_after_s, date_part('epoch', k.claimed_at + interval '$p90 ms' - clock_timestamp())
	FROM idem_claim('job-6', scope => 'work') AS c, idem_keys AS k
	WHERE k.scope = 'work' AND k.key = 'job-6'});
cmp_ok(abs($retry_after_s - $remaining), '<=', 1,
	"retry_after_s ($retry_after_s) within 1 s of the job's remaining time by p90 ($remaining s)");
cmp_ok($retry_after_s, '>=', 1, 'and at least 1');
# Never more than the lease allows.
sql(q{SELECT idem_claim('job-7', scope => 'work', lease => '1 second')});
is(sql(q{SELECT retry_after_s FROM idem_claim('job-7', scope => 'work')}), 1,
	'a lease of 1 s caps the estimate at 1');
# Tracking off: the statistics are not consulted.
sql(q{SELECT idem_claim('job-8', scope => 'work')});
cmp_ok(sql(q{SET idempotency.track = off; SELECT retry_after_s FROM idem_claim('job-8', scope => 'work')}),
	'>=', 50, 'idempotency.track = off: ceil(retry_after)');
cmp_ok(sql(q{SELECT retry_after_s FROM idem_claim('job-8', scope => 'work')}), '<=', 3,
	'the same duplicate with tracking on: the estimate');
# Another scope knows nothing of this one's work time.
sql(q{SELECT idem_claim('job-1', scope => 'other')});
cmp_ok(sql(q{SELECT retry_after_s FROM idem_claim('job-1', scope => 'other')}), '>=', 50,
	'another scope: ceil(retry_after)');

# ---- a restart empties everything
cmp_ok(sql(q{SELECT count(*) FROM idem_scope_stats}), '>', 0, 'entries before the restart');
$node->restart;
is(sql(q{SELECT count(*) FROM idem_scope_stats}), 0, 'none after a restart');
cmp_ok(sql(q{SELECT retry_after_s FROM idem_claim('job-8', scope => 'work')}), '>=', 10,
	'the work time is forgotten with them: the lease left again');
ok(!$node->log_contains(qr/TRAP|\(PID \d+\) was terminated/), 'no crash in the log');

$node->stop;
done_testing();
