# Claiming at a high rate floods no log and leaves no range of idem_keys unsummarized for the
# reaper. With autosummarize on the BRIN index of expires_at, every claim that starts a
# new block range queues a summarization request in autovacuum's small work-item queue; when
# autovacuum drains it slower than claims fill it (here: a naptime of a day), PostgreSQL logs
# "request for BRIN range summarization ... was not recorded" and the range stays unsummarized,
# so the reaper's scan reads it whole. Reaping summarizes the new ranges itself instead.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('brin_flood');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_enabled = off
autovacuum_naptime = '1d'
log_min_messages = log
max_connections = 20
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

my $index = 'idem_keys_expires_at_idx';

# Keys that must outlive the reaping, then the flood: batches of claims with a short ttl, from
# as many clients as there are cores, well past the 256 requests autovacuum's queue holds
# (8192 pages of 32-page ranges, about 200,000 keys).
$node->safe_psql('postgres', q{
	SELECT count(idem_claim('live-' || g, ttl => '1 hour')) FROM generate_series(1, 100) g;
});
my $batch = 2000;
my $script = PostgreSQL::Test::Utils::tempdir() . '/claims.sql';
PostgreSQL::Test::Utils::append_to_file($script,
	"SELECT count(idem_claim('flood-' || gen_random_uuid(), ttl => '1 second', "
	  . "lease => '1 second')) FROM generate_series(1, $batch);\n");
my $transactions = 75;
my $clients = 4;
$node->command_ok(
	[
		'pgbench', '-n', '-c', $clients, '-j', 2, '-t', $transactions, '-f', $script,
		'-h', $node->host, '-p', $node->port, 'postgres'
	],
	'the claim flood ran');
my $claimed = $clients * $transactions * $batch;

my $pages = $node->safe_psql('postgres',
	"SELECT pg_relation_size('idem_keys') / current_setting('block_size')::int");
cmp_ok($pages, '>', 8192, "the table outgrew autovacuum's queue ($pages pages)");

my $log = slurp_file($node->logfile);
my @flood = ($log =~ /request for BRIN range summarization[^\n]*was not recorded/g);
is(scalar @flood, 0, 'no summarization request was dropped (none logged)');

# Every flood key expired a second after its claim: reaping must find every one, in batches,
# and summarize every complete range on the way.
sleep 2;
my $reaped = 0;
for (my $round = 0; $round < 1000; $round++)
{
	my $n = $node->safe_psql('postgres', 'SELECT idem_reap(50000)');
	$reaped += $n;
	last if $n == 0;
}
is($reaped, $claimed, "reaping found every expired key ($claimed)");
is($node->safe_psql('postgres', 'SELECT count(*) FROM idem_keys'), '100',
	'only the live keys are left');

# Only the last, partial, range may still be without a summary.
cmp_ok($node->safe_psql('postgres', "SELECT brin_summarize_new_values('$index')"),
	'<=', 1, 'reaping summarized every complete range');

# A reap as a role that has only DELETE on idem_keys summarizes too (it does not own the index).
$node->safe_psql('postgres', q{
	CREATE ROLE reaper_role LOGIN;
	GRANT USAGE ON SCHEMA public TO reaper_role;
	GRANT DELETE ON idem_keys TO reaper_role;
	GRANT EXECUTE ON FUNCTION idem_reap(integer) TO reaper_role;
	SELECT count(idem_claim('more-' || g, ttl => '1 second', lease => '1 second'))
	FROM generate_series(1, 20000) g;
});
sleep 2;
$node->safe_psql('postgres', 'SELECT idem_reap(100000)', extra_params => [ '-U', 'reaper_role' ]);
cmp_ok($node->safe_psql('postgres', "SELECT brin_summarize_new_values('$index')"),
	'<=', 1, 'a reap by a role that does not own the index summarized the new ranges');

# Under row-level security, reaping takes the SQL path, which summarizes the new ranges too: a
# tenant deletes only its own expired keys, and every complete range gets its summary. (Emptied
# first: new keys would otherwise fill the space reaping freed, in ranges summarized already.)
$node->safe_psql('postgres', 'TRUNCATE idem_keys');
my $pages_sql = "SELECT pg_relation_size('idem_keys') / current_setting('block_size')::int";
my $pages_before = $node->safe_psql('postgres', $pages_sql);
$node->safe_psql('postgres', q{
	CREATE ROLE tenant LOGIN;
	GRANT USAGE ON SCHEMA public TO tenant;
	GRANT SELECT, INSERT, UPDATE, DELETE ON idem_keys TO tenant;
	GRANT EXECUTE ON FUNCTION idem_reap(integer) TO tenant;
	ALTER TABLE idem_keys ENABLE ROW LEVEL SECURITY;
	CREATE POLICY own_scope ON idem_keys USING (scope = current_user) WITH CHECK (scope = current_user);
	SELECT count(idem_claim('rls-' || g, scope => CASE WHEN g % 2 = 0 THEN 'tenant' ELSE 'other' END,
	                        ttl => '1 second', lease => '1 second'))
	FROM generate_series(1, 20000) g;
});
my $new_pages = $node->safe_psql('postgres', $pages_sql) - $pages_before;
cmp_ok($new_pages, '>=', 3 * 32, "the claims filled new ranges ($new_pages pages)");
sleep 2;
is($node->safe_psql('postgres', 'SELECT idem_reap(100000)', extra_params => [ '-U', 'tenant' ]),
	'10000', "a reap under row-level security deleted the tenant's expired keys only");
is($node->safe_psql('postgres', "SELECT count(*) FROM idem_keys WHERE scope = 'other'"),
	'10000', "the other scope's keys are left");
cmp_ok($node->safe_psql('postgres', "SELECT brin_summarize_new_values('$index')"),
	'<=', 1, 'a reap under row-level security summarized the new ranges');

$log = slurp_file($node->logfile);
unlike($log, qr/was not recorded/, 'still no dropped summarization request in the log');

$node->stop;
done_testing();
