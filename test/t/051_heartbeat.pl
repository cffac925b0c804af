# Heartbeats (docs/contract.md §9.4, idem_extend): a 30 s job kept alive under a 5 s lease, and a crashed
# heartbeater's key taken over once its last lease ends.
#
# A. The owner claims with lease => '5 s' and, for 30 s, calls idem_extend(key, 1, '5 s') every
#    third of a second (a worker's heartbeat thread).  Between heartbeats a duplicate claims the key:
#    in_progress every time, with retry_after_s of at most 5; no claim ever takes the key over.
#    (Heartbeat and duplicate alternate in two open sessions, a third of a second apart.)
#    The owner then completes with attempt 1 (it was never fenced off) and the duplicate replays.
# B. A second owner heartbeats a few times, then its session dies (its backend is terminated, as
#    when the worker's process or connection is gone).  Until its last lease ends (by the database
#    clock) a duplicate gets in_progress; the first claim after it takes the key over (attempt 2),
#    and the dead owner's late heartbeat and completion get IK002.
# The loops are bounded by the wall clock; the heartbeat period leaves over 4.5 s of a 5 s lease
# spare, for a loaded machine.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use IdemSqlstate;
use Time::HiRes qw(time sleep);

my $node = PostgreSQL::Test::Cluster->new('heartbeat');
$node->init;
$node->start;

sub sql { return $node->safe_psql('postgres', $_[0]); }

sub sqlstate { return sqlstate_of($node, $_[0]); }

sql('CREATE EXTENSION idempotency');
my $req = q{'{"export": "2026-11", "rows": 1000000}'};

# ---- A. a 30 s job under a 5 s lease
# Both sides are long-lived sessions: starting a psql per call could take longer than the lease on
# a loaded machine.
my $owner = $node->background_psql('postgres', on_error_stop => 0);
my $dup = $node->background_psql('postgres', on_error_stop => 0);
is($owner->query_safe(qq{SELECT outcome || ',' || attempt FROM idem_claim('job', $req, lease => '5 s')}),
	'claimed,1', 'the owner claimed the job with a 5 s lease');

my $start = time;
my ($beats, $dups, @unexpected) = (0, 0);
while (time - $start < 30)
{
	my ($beat, $beat_err) = $owner->query(
		q{SELECT attempt || ',' || (locked_until > clock_timestamp()) FROM idem_extend('job', 1, '5 s')});
	push @unexpected, "heartbeat $beats: $beat" . ($beat_err ? ' (error)' : '') if $beat ne '1,true' || $beat_err;
	$beats++;
	my ($claim, $claim_err) = $dup->query(
		qq{SELECT concat_ws(',', outcome, inserted, attempt, retry_after_s BETWEEN 1 AND 5)
		   FROM idem_claim('job', $req, lease => '5 s')});
	push @unexpected, "duplicate $dups: $claim" . ($claim_err ? ' (error)' : '') if $claim ne 'in_progress,f,1,t' || $claim_err;
	$dups++;
	last if @unexpected > 5;
	sleep 0.3;
}
note "$beats heartbeats, $dups duplicate claims in " . sprintf('%.1f s', time - $start);
cmp_ok(time - $start, '>=', 30, 'the job ran for 30 s, six times its lease');
is_deeply(\@unexpected, [], "every heartbeat kept the lease; every duplicate claim ($dups) got in_progress");
is($owner->query_safe(q{SELECT state || ',' || attempt FROM idem_complete('job', '{"file": "s3://x"}', attempt => 1)}),
	'succeeded,1', 'the owner completes with attempt 1: nobody took the job over');
is($dup->query_safe(qq{SELECT outcome || ',' || response_code FROM idem_claim('job', $req)}), 'replay,200',
	'the duplicate replays');
$owner->quit;
$dup->quit;

# ---- B. a crashed heartbeater
my $dead = $node->background_psql('postgres', on_error_stop => 0);
$dead->query_safe(qq{SELECT idem_claim('job2', $req, lease => '2 s')});
$dead->query_safe(q{SELECT idem_extend('job2', 1, '2 s')}) for 1 .. 3;
my $pid = $dead->query_safe('SELECT pg_backend_pid()');
is(sql("SELECT pg_terminate_backend($pid)"), 't', 'the heartbeater\'s session dies');
$dead->quit;
my $last_lease_end = sql(q{SELECT locked_until FROM idem_keys WHERE key = 'job2'});

# before the last lease ends: in_progress (judged by the database clock around each claim); the
# poller is an open session, so that a poll takes milliseconds, not a process start
my $poller = $node->background_psql('postgres');
my ($early, $took_over) = (0, 0);
my $deadline = time + 60;
while (time < $deadline)
{
	my ($before, $outcome, $after) = split /\|/, $poller->query_safe(qq{
		SELECT (clock_timestamp() < '$last_lease_end'::timestamptz)::text || '|'
		       || (SELECT outcome || ',' || attempt FROM idem_claim('job2', $req, lease => '1 minute')) || '|'
		       || (clock_timestamp() < '$last_lease_end'::timestamptz)::text});
	if ($outcome eq 'claimed,2')
	{
		is($after, 'false', 'the key was taken over only after its last lease ended');
		$took_over = 1;
		last;
	}
	is($outcome, 'in_progress,1', 'a claim during the last lease gets in_progress') unless $early++;
	die "a claim after the last lease ended got $outcome" if $before eq 'false';
	sleep 0.1;
}
$poller->quit;
ok($took_over, 'the first claim after the last lease ended took the key over (attempt 2)');
note 'taken over ' . sql(qq{SELECT claimed_at - '$last_lease_end'::timestamptz FROM idem_keys WHERE key = 'job2'})
  . ' after the last lease ended';
is(sqlstate(q{SELECT idem_extend('job2', 1, '2 s')}), 'IK002', 'the dead owner\'s late heartbeat is stale');
is(sqlstate(q{SELECT idem_complete('job2', '{}', attempt => 1)}), 'IK002', 'so is its late completion');

$node->stop;
done_testing();
