# Batch claims under concurrency: 16 pgbench clients act as consumers, each transaction a batch
# of 20 ids drawn at random (in random order, repeats included) from 300, claimed with
# idem_claim_batch, the claimed ones applied (a business row each) and completed with
# idem_complete_batch in the same transaction; 1 in 10 transactions rolls back. Half the clients
# wait for in-flight ids (no `wait`), half never block (`wait => '0'`).
#
# Batches overlap in every order: a deadlock would fail a transaction (40P01). Afterwards each
# succeeded id has exactly one business row, no business row lacks its succeeded id, and no id is
# left pending. The business table has no unique constraint: a double apply would show as a
# second row.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

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
});
$node->start;

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE TABLE applied (key text NOT NULL, client_id integer NOT NULL);  -- deliberately not unique
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

my @runs = (
	[ 'waiting', run_pgbench('waiting', $waiting) ],
	[ 'nowait',  run_pgbench('nowait',  $nowait) ]);
my $total = $clients / 2 * $per_client;
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

sub query { return $node->safe_psql('postgres', $_[0]); }

my $succeeded = query(q{SELECT count(*) FROM idem_keys WHERE scope = 'stress' AND state = 'succeeded'});
ok($succeeded > 200, "most of the 300 ids were applied ($succeeded)");
is(query(q{SELECT count(*) FROM idem_keys WHERE scope = 'stress' AND state <> 'succeeded'}),
	'0', 'no id left pending');
is(query(q{SELECT count(*) FROM (SELECT key FROM applied GROUP BY key HAVING count(*) > 1) d}),
	'0', 'no id applied twice');
is( query(
		q{SELECT count(*) FROM idem_keys k WHERE k.scope = 'stress'
		    AND NOT EXISTS (SELECT FROM applied a WHERE a.key = k.key)}),
	'0', 'every succeeded id was applied');
is( query(
		q{SELECT count(*) FROM applied a
		   WHERE NOT EXISTS (SELECT FROM idem_keys k WHERE k.scope = 'stress' AND k.key = a.key)}),
	'0', 'no business row without its id');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_keys WHERE scope = 'stress' AND attempt <> 1}),
	'0', 'no takeover: every id was claimed once, at attempt 1');

$node->stop;
done_testing();
