# Batch claims under concurrency: 16 pgbench clients act as consumers, each transaction a batch
# of 20 ids drawn at random (in random order, repeats included) from 300, claimed with
# idem_claim_batch, the claimed ones applied (a business row each) and completed with
# idem_complete_batch in the same transaction; 1 in 10 transactions rolls back. Half the clients
# wait for in-flight ids (no `wait`), half never block (`wait => '0'`). Then the same with
# `applied => true` (1.4): the claim is the record, no completion.
#
# Batches overlap in every order: a deadlock would fail a transaction (40P01). Afterwards each
# succeeded id has exactly one business row, no business row lacks its succeeded id, and no id is
# left pending. The business table has no unique constraint: a double apply would show as a
# second row.
#
# Then kill -9 of a backend in the middle of a large applied batch: after the crash restart
# nothing of the batch is there, and running it again claims every id.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use IdemCrash;

my $clients = 16;
my $per_client = 60;
my $node = PostgreSQL::Test::Cluster->new('batch_consumers');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
max_connections = 40
log_min_messages = warning
deadlock_timeout = 100ms
restart_after_crash = on
});
$node->start;

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE EXTENSION pageinspect;
-- deliberately not unique
CREATE TABLE applied (scope text NOT NULL DEFAULT 'stress', key text NOT NULL, client_id integer NOT NULL);
});

sub run_pgbench
{
	my ($name, $script) = @_;
	my $file = $node->basedir . "/$name.sql";
	PostgreSQL::Test::Utils::append_to_file($file, $script);
	my @cmd = (
		'pgbench', '-n', '-c', $clients / 2, '-j', 2, '-t', $per_client,
		'-h', $node->host, '-p', $node->port, '-f', $file, 'postgres');
	note "running: @cmd";
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(\@cmd, '>', \$out, '2>', \$err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	return ($h, \$out, \$err);
}

my $batch = q{
\set r random(1, 10)
BEGIN;
WITH c AS MATERIALIZED (
    SELECT key FROM idem_claim_batch(
        array(SELECT 'm' || floor(random() * 300)::int FROM generate_series(1, 20)), 'stress' WAIT)
     WHERE outcome = 'claimed'
), w AS (
    INSERT INTO applied (key, client_id) SELECT key, :client_id FROM c RETURNING key
)
SELECT idem_complete_batch(array(SELECT key FROM w), 'stress');
\if :r = 1
ROLLBACK;
\else
COMMIT;
\endif
};
(my $waiting = $batch) =~ s/ WAIT//;
(my $nowait = $batch) =~ s/ WAIT/, wait => '0'/;

# Applied mode: the business rows and the claims, written together, are the whole transaction.
my $applied_batch = q{
\set r random(1, 10)
BEGIN;
INSERT INTO applied (scope, key, client_id)
SELECT 'stress-applied', key, :client_id FROM idem_claim_batch(
    array(SELECT 'm' || floor(random() * 300)::int FROM generate_series(1, 20)), 'stress-applied',
    applied => true WAIT)
 WHERE outcome = 'claimed';
\if :r = 1
ROLLBACK;
\else
COMMIT;
\endif
};
(my $applied_waiting = $applied_batch) =~ s/ WAIT//;
(my $applied_nowait = $applied_batch) =~ s/ WAIT/, wait => '0'/;

sub query { return $node->safe_psql('postgres', $_[0]); }

my $total = $clients / 2 * $per_client;
for my $mode ([ 'stress', $waiting, $nowait ], [ 'stress-applied', $applied_waiting, $applied_nowait ])
{
	my ($scope, $wait_script, $nowait_script) = @$mode;
	my @runs = (
		[ "$scope waiting", run_pgbench("$scope-waiting", $wait_script) ],
		[ "$scope nowait",  run_pgbench("$scope-nowait",  $nowait_script) ]);
	for my $run (@runs)
	{
		my ($name, $h, $out, $err) = @$run;
		$h->finish;
		is($h->result(0), 0, "$name: pgbench exits 0");
		like($$out, qr/number of transactions actually processed: $total\/$total\b/,
			"$name: all $total transactions processed");
		unlike($$err, qr/ERROR|deadlock|aborted/, "$name: no error, no deadlock");
		diag "pgbench $name stderr:\n$$err" if $$err ne '';
	}

	my $succeeded = query(qq{SELECT count(*) FROM idem_keys WHERE scope = '$scope' AND state = 'succeeded'});
	ok($succeeded > 200, "$scope: most of the 300 ids were applied ($succeeded)");
	is(query(qq{SELECT count(*) FROM idem_keys WHERE scope = '$scope' AND state <> 'succeeded'}),
		'0', "$scope: no id left pending");
	is( query(
			qq{SELECT count(*) FROM (SELECT key FROM applied WHERE scope = '$scope' GROUP BY key HAVING count(*) > 1) d}),
		'0', "$scope: no id applied twice");
	is( query(
			qq{SELECT count(*) FROM idem_keys k WHERE k.scope = '$scope'
			    AND NOT EXISTS (SELECT FROM applied a WHERE a.scope = k.scope AND a.key = k.key)}),
		'0', "$scope: every succeeded id was applied");
	is( query(
			qq{SELECT count(*) FROM applied a WHERE a.scope = '$scope'
			   AND NOT EXISTS (SELECT FROM idem_keys k WHERE k.scope = a.scope AND k.key = a.key)}),
		'0', "$scope: no business row without its id");
	is(query(qq{SELECT count(*) FROM idem_keys WHERE scope = '$scope' AND attempt <> 1}),
		'0', "$scope: no takeover: every id was claimed once, at attempt 1");
}
is(query(q{SELECT count(*) FROM idem_keys WHERE scope = 'stress-applied' AND (locked_until IS NOT NULL OR completed_at IS NULL)}),
	'0', 'applied mode: every id stored completed, without a lease');

# ---- kill -9 of a backend in the middle of a large applied batch
# A second session holds crash-5 uncommitted, so the batch, taking its ids in key order, writes
# the ids before it (crash-1..., crash-2..., crash-3..., crash-4...: 4 in 9 of them) and then waits.
my $n = 20000;
my $batch_sql = qq{SELECT count(*) FROM idem_claim_batch(
    array(SELECT 'crash-' || g FROM generate_series(1, $n) g), 'crash', applied => true)};
my $holder = $node->background_psql('postgres', on_error_stop => 0);
$holder->query_safe(q{BEGIN; SELECT count(*) FROM idem_claim_batch(ARRAY['crash-5'], 'crash', applied => true)});
my $consumer = $node->background_psql('postgres', on_error_stop => 0);
my $victim = $consumer->query_safe('SELECT pg_backend_pid()');
$consumer->{stdin} .= "BEGIN; $batch_sql; COMMIT;\n";
$consumer->{run}->pump_nb;
ok( $node->poll_query_until(
		'postgres', qq{SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $victim}),
	'the large applied batch waits for crash-5');
# What the batch has written so far: the row versions its own transaction created (the table's
# size says nothing: earlier steps left free space that the batch fills first).
my $xid = query(qq{SELECT backend_xid FROM pg_stat_activity WHERE pid = $victim});
my $written = query(
	qq{SELECT count(*) FROM generate_series(0, pg_relation_size('idem_keys') / current_setting('block_size')::int - 1) b,
	          heap_page_items(get_raw_page('idem_keys', b::int)) WHERE t_xmin = '$xid'::xid});
ok($xid ne '' && $written > 0 && $written < $n,
	"the batch has written its first ids, not all of them ($written row versions of transaction $xid)");

my $logstart = -s $node->logfile;
ok(kill('KILL', $victim), "SIGKILL sent to the batch's backend ($victim)");
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $logstart);
ok(poll_after_crash($node, 'postgres', 'SELECT true'), 'the server accepts connections again');
# "server process (PID n)" until 17, "client backend (PID n)" from 18
ok($node->log_contains(qr/(server process|client backend) \(PID $victim\) was terminated by signal 9/, $logstart),
	'the backend died of SIGKILL and the postmaster restarted');
# the two psql clients lost their backends (the consumer's has exited already): end them
$_->{run}->kill_kill for ($holder, $consumer);

is(query(q{SELECT count(*) FROM idem_keys WHERE scope = 'crash'}), '0', 'nothing of the batch is visible after recovery');
is( query(qq{SELECT count(*) FILTER (WHERE outcome = 'claimed' AND inserted) FROM idem_claim_batch(
                array(SELECT 'crash-' || g FROM generate_series(1, $n) g), 'crash', applied => true)}),
	$n, "running the batch again claims all $n ids as new");
is( query(q{SELECT count(*) FILTER (WHERE state = 'succeeded' AND attempt = 1) || '/' || count(*)
              FROM idem_keys WHERE scope = 'crash'}),
	"$n/$n", 'and claims every id, applied, at attempt 1');

$node->stop;
done_testing();
