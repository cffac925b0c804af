# idem_stats with per-backend counters: every backend counts in its own slot and the
# view sums them. The counts of backends that have exited stay, concurrent counting loses
# nothing, a reset zeroes what live and exited backends counted, and databases stay apart.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('stats_backends');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_enabled = off
max_connections = 20
});
$node->start;
for my $db (qw(postgres other))
{
	$node->safe_psql('postgres', "CREATE DATABASE $db") if $db ne 'postgres';
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
}

sub stats
{
	my ($db) = @_;
	return $node->safe_psql($db,
		'SELECT claims || \',\' || inserted || \',\' || replays || \',\' || completes FROM idem_stats');
}

# 4 clients, a new connection for each transaction (-C): 200 backends count and exit.
my $script = PostgreSQL::Test::Utils::tempdir() . '/claim.sql';
PostgreSQL::Test::Utils::append_to_file($script, q{
SELECT idem_claim('k-' || gen_random_uuid());
SELECT idem_claim('same');
});
$node->command_ok(
	[
		'pgbench', '-n', '-C', '-c', 4, '-j', 2, '-t', 50, '-f', $script,
		'-h', $node->host, '-p', $node->port, 'postgres'
	],
	'200 short sessions claimed');
# 400 claims: 200 new keys, 'same' inserted once and then in_progress or replayed.
my ($claims, $inserted) = split /,/, stats('postgres');
is($claims, 400, 'the claims of exited backends are all counted');
is($inserted, 201, 'and every insert');
is(stats('other'), '0,0,0,0', 'another database counts nothing of them');

# A live session's counts show at once, beside the exited ones'.
my $live = $node->background_psql('postgres');
my $live_pid = $live->query_safe('SELECT pg_backend_pid()');
$live->query_safe(q{SELECT idem_claim('live-' || g) FROM generate_series(1, 10) g});
$live->query_safe(q{SELECT idem_complete('live-1', '{}', 200)});
is(stats('postgres'), '410,211,0,1', 'a live backend\'s counts are summed with them');

# A reset zeroes live and exited counts alike; the live backend then counts from zero.
$node->safe_psql('postgres', 'SELECT idem_stats_reset()');
is(stats('postgres'), '0,0,0,0', 'reset zeroes every backend\'s counts');
$live->query_safe(q{SELECT idem_claim('live-2')});
is(stats('postgres'), '1,0,0,0', 'counting resumes from the reset');
$live->quit;
ok($node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $live_pid"),
	'the live backend exited');
is(stats('postgres'), '1,0,0,0', 'the count stays after its backend exits, without double counting');

$node->stop;
done_testing();
