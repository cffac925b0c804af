# kill -9 of a backend that holds a lease-mode claim.
#
# Session A claims key "pay-a" in lease mode (committed, lease 30 s) and is about to call the
# payment provider.  Session B claimed "pay-b" the same way and is in the middle of completing it
# (BEGIN; idem_complete(...); not committed).  Session C is in the middle of a same-transaction
# claim of "pay-c" (BEGIN; idem_claim(...); not committed).  "pay-d" was claimed and completed
# before.  A's backend is killed with SIGKILL: the postmaster treats that as a crash, terminates
# every backend (B and C too), reinitialises shared memory and runs crash recovery.
#
# Afterwards:
#  - pay-a is pending with attempt 1 and its lease unchanged; every claim made before the lease
#    end (checked against the database clock) gets in_progress with retry_after > 0 and writes
#    nothing; the first claim after the lease end takes it over: claimed, inserted false,
#    attempt 2;
#  - pay-b's uncommitted completion is gone: pending, attempt 1, then taken over the same way;
#  - pay-c's uncommitted claim is gone: the next claim inserts it (attempt 1);
#  - pay-d is still succeeded and replays;
#  - the dead owner's late completion (from a new connection, attempt => 1) gets IK002 and
#    changes nothing, for idem_complete and idem_fail; the new owner (attempt 2) completes.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use FindBin;
use lib "$FindBin::RealBin/../perl";
use IdemCrash;

my $lease = 30;    # seconds: long enough to outlast the crash restart on a loaded machine, with claims to spare

my $node = PostgreSQL::Test::Cluster->new('crash_lease');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
restart_after_crash = on
});
$node->start;

sub query { return $node->safe_psql('postgres', $_[0]); }

query('CREATE EXTENSION idempotency');
my $req = q{'{"amount": 100, "currency": "EUR"}'};

# pay-d: finished before the crash
query(qq{SELECT idem_claim('pay-d', $req, lease => '$lease s');
         SELECT idem_complete('pay-d', '{"payment_id": "p_d"}', 201, attempt => 1)});

# A: lease-mode claim, committed; the session stays connected (calling the provider)
my $a = $node->background_psql('postgres', on_error_stop => 0);
is( $a->query_safe(qq{SELECT outcome || ',' || inserted || ',' || attempt
                      FROM idem_claim('pay-a', $req, lease => '$lease s')}),
	'claimed,true,1', 'A claimed pay-a (lease mode, committed)');
my $a_pid = $a->query_safe('SELECT pg_backend_pid()');

# B: lease-mode claim committed, then an uncommitted completion
my $b = $node->background_psql('postgres', on_error_stop => 0);
$b->query_safe(qq{SELECT idem_claim('pay-b', $req, lease => '$lease s')});
is( $b->query_safe(q{BEGIN; SELECT state FROM idem_complete('pay-b', '{"payment_id": "p_b"}', 201, attempt => 1)}),
	'succeeded', 'B completes pay-b in a transaction that will never commit');

# C: same-transaction mode, claim not committed
my $c = $node->background_psql('postgres', on_error_stop => 0);
is($c->query_safe(qq{BEGIN; SELECT outcome FROM idem_claim('pay-c', $req)}),
	'claimed', 'C claims pay-c in a transaction that will never commit');

my $before = query(q{SELECT key, state, attempt, locked_until, response IS NULL, xmin
                     FROM idem_keys ORDER BY key});
note "committed state before the crash:\n$before";
my ($lu_a) = query(q{SELECT locked_until FROM idem_keys WHERE key = 'pay-a'});
my ($lu_b) = query(q{SELECT locked_until FROM idem_keys WHERE key = 'pay-b'});

# ---- kill -9 of A's backend
my $logstart = -s $node->logfile;
ok(kill('KILL', $a_pid), "SIGKILL sent to A's backend ($a_pid)");
# the postmaster terminates every backend, reinitialises and recovers: wait until it answers
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $logstart);
ok(poll_after_crash($node, 'postgres', 'SELECT true'), 'the server accepts connections again');
# "server process (PID n)" until 17, "client backend (PID n)" from 18
ok($node->log_contains(qr/(server process|client backend) \(PID $a_pid\) was terminated by signal 9/, $logstart),
	'the postmaster saw the backend die of SIGKILL');
ok($node->log_contains(qr/terminating any other active server processes/, $logstart),
	'and restarted every backend');
ok($node->log_contains(qr/database system was not properly shut down; automatic recovery in progress/, $logstart),
	'crash recovery ran');

# the three psql sessions are idle clients of dead backends: end them
$_->quit for ($a, $b, $c);

# ---- right after recovery
is( query(q{SELECT string_agg(key || ':' || state || ':' || attempt || ':' || (response IS NULL), ' ' ORDER BY key)
            FROM idem_keys}),
	'pay-a:pending:1:true pay-b:pending:1:true pay-d:succeeded:1:false',
	'after recovery: pay-a and pay-b pending with attempt 1 (B\'s completion is gone), pay-c absent, pay-d succeeded');
is(query(q{SELECT locked_until FROM idem_keys WHERE key = 'pay-a'}), $lu_a, 'pay-a keeps its lease');
is(query(q{SELECT locked_until FROM idem_keys WHERE key = 'pay-b'}), $lu_b, 'pay-b keeps its lease');

is( query(qq{SELECT outcome || ',' || inserted || ',' || attempt FROM idem_claim('pay-c', $req)}),
	'claimed,true,1', 'pay-c: the uncommitted claim was rolled back; the next claim inserts it');
like( query(qq{SELECT outcome || ',' || attempt || ',' || response_code || ',' || (response->>'payment_id')
               FROM idem_claim('pay-d', $req)}),
	qr/^replay,1,201,p_d$/, 'pay-d replays its stored response');

# ---- before the lease end: in_progress, nothing written
# Each claim is followed, in the same session, by a look at the database clock: a claim that
# returned before the lease end must have been made before it, so it must be in_progress.
my ($before_end, $straddling) = (0, 0);
my @wrong;
my $takeover;
my $deadline = time + $lease + 60;
while (time < $deadline)
{
	my $xmin_before = query(q{SELECT xmin FROM idem_keys WHERE key = 'pay-a'});
	my ($res, $still_live) = split /\n/, query(qq{
		SELECT outcome || ',' || inserted || ',' || attempt || ',' || coalesce(extract(epoch FROM retry_after)::text, '')
		  FROM idem_claim('pay-a', $req, lease => '30 s');
		SELECT clock_timestamp() < '$lu_a'::timestamptz});
	my ($outcome, $inserted, $attempt, $retry) = split /,/, $res;
	if ($outcome eq 'claimed')
	{
		$takeover = $res;
		last;
	}
	my $wrote = query(q{SELECT xmin FROM idem_keys WHERE key = 'pay-a'}) ne $xmin_before;
	if ($still_live eq 't')
	{
		$before_end++;
		push @wrong, $res
		  unless "$outcome,$inserted,$attempt" eq 'in_progress,false,1'
		  && $retry > 0 && $retry <= $lease && !$wrote;
	}
	else
	{
		$straddling++;    # made before the lease end, returned after it
		push @wrong, $res unless $outcome eq 'in_progress' && !$wrote;
	}
	sleep 0.5;
}
note "claims before the lease end: $before_end, straddling it: $straddling";
cmp_ok($before_end, '>=', 3, "several claims were made before the lease end ($before_end)");
is(join(' ', @wrong), '',
	'every one of them got in_progress, attempt 1, 0 < retry_after <= lease, and wrote nothing');
is($takeover, 'claimed,false,2,', 'after the lease end pay-a is taken over: claimed, not inserted, attempt 2');
# pay-b was claimed a little after pay-a: its lease ends a little later
ok($node->poll_query_until('postgres', q{SELECT clock_timestamp() >= locked_until FROM idem_keys WHERE key = 'pay-b'}),
	'pay-b\'s lease has ended too');
is(query(qq{SELECT outcome || ',' || inserted || ',' || attempt FROM idem_claim('pay-b', $req, lease => '30 s')}),
	'claimed,false,2', 'pay-b is taken over: attempt 2');

# ---- the dead owner comes back late, from a new connection, with attempt 1
my $state_a = query(q{SELECT idem_keys::text FROM idem_keys WHERE key = 'pay-a'});
my $state_b = query(q{SELECT idem_keys::text FROM idem_keys WHERE key = 'pay-b'});
my ($rc, $out, $err) = $node->psql('postgres',
	q{SELECT * FROM idem_complete('pay-a', '{"payment_id": "p_a_late"}', 201, attempt => 1)},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
isnt($rc, 0, 'the late idem_complete(attempt => 1) fails');
like($err, qr/ERROR:\s+IK002: attempt 1 of idempotency key "pay-a" is stale/,
	'with IK002 (attempt_stale)');
like($err, qr/DETAIL:\s+The key was taken over/, 'the detail says the key was taken over');
# the same from a DO block that reports the SQLSTATE, for idem_fail
($rc, $out, $err) = $node->psql('postgres', q{
DO $$
BEGIN
    PERFORM idem_fail('pay-b', '{"error": "late"}', 502, true, attempt => 1);
    RAISE NOTICE 'no error';
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'sqlstate %', SQLSTATE;
END
$$});
like($err, qr/NOTICE:\s+sqlstate IK002/, 'the late idem_fail(attempt => 1) gets IK002 too');
is(query(q{SELECT idem_keys::text FROM idem_keys WHERE key = 'pay-a'}), $state_a, 'pay-a unchanged by the late completion');
is(query(q{SELECT idem_keys::text FROM idem_keys WHERE key = 'pay-b'}), $state_b, 'pay-b unchanged by the late failure');

# ---- the new owner finishes; the old one still cannot
is(query(q{SELECT state || ',' || attempt FROM idem_complete('pay-a', '{"payment_id": "p_a2"}', 201, attempt => 2)}),
	'succeeded,2', 'the new owner (attempt 2) completes pay-a');
($rc, $out, $err) = $node->psql('postgres',
	q{SELECT * FROM idem_complete('pay-a', '{"payment_id": "p_a_late"}', 201, attempt => 1)},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:\s+IK002:/, 'after that, the old owner still gets IK002 (fencing is checked before the state)');
like(query(qq{SELECT outcome || ',' || attempt || ',' || (response->>'payment_id') FROM idem_claim('pay-a', $req)}),
	qr/^replay,2,p_a2$/, 'a retry replays the new owner\'s response');
is(query(q{SELECT state || ',' || attempt FROM idem_fail('pay-b', '{"error": "declined"}', 402, false, attempt => 2)}),
	'failed,2', 'the new owner of pay-b records a final failure');

$node->stop;
done_testing();
