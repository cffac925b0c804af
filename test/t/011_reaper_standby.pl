# The background reaper starts only after recovery: a hot standby built from a backup runs no
# launcher and no reaper (its idem_keys keeps the expired keys, which only the primary may delete);
# after promotion it runs both and reaps.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
# the primary's reaper is off so that the expired keys reach the standby and stay
$primary->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_naptime = 1s
idempotency.reaper_enabled = off
});
$primary->start;
$primary->safe_psql('postgres', 'CREATE DATABASE app');
$primary->safe_psql('app', 'CREATE EXTENSION idempotency');
$primary->safe_psql('app', q{
	SELECT idem_claim('exp-' || g, ttl => '1 millisecond', lease => '1 millisecond')
	FROM generate_series(1, 100) g;
	SELECT idem_claim('live', ttl => '1 hour');
});

$primary->backup('bk');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'bk', has_streaming => 1);
$standby->append_conf('postgresql.conf', 'idempotency.reaper_enabled = on');
$standby->start;
$primary->wait_for_catchup($standby);

is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't', 'the standby is in recovery');
is($standby->safe_psql('postgres', 'SHOW idempotency.reaper_enabled'), 'on', 'its reaper is enabled');
# give a launcher every chance to show up: five naptimes
sleep 5;
is($standby->safe_psql('postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency%'"),
	0, 'no launcher and no reaper on a hot standby');
is($standby->safe_psql('app', 'SELECT count(*) FROM idem_keys'), 101, 'the expired keys are still there');
ok(!$standby->log_contains(qr/idempotency reaper|background worker "idempotency/),
	'nothing in the standby log from the workers');
# the stats view answers on the standby too
is($standby->safe_psql('app', 'SELECT claims FROM idem_stats'), 0, 'idem_stats answers on the standby');

$standby->promote;
ok($standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()'), 'promoted');
ok($standby->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'"),
	'after promotion the launcher runs');
ok($standby->poll_query_until('app', 'SELECT count(*) = 1 FROM idem_keys'),
	'after promotion the reaper deletes the expired keys');
is($standby->safe_psql('app', 'SELECT key FROM idem_keys'), 'live', 'the live key stays');
is($standby->safe_psql('app', 'SELECT reaped FROM idem_stats'), 100, 'idem_stats counts the reaped keys');

# the primary, its reaper off, still has them
is($primary->safe_psql('app', 'SELECT count(*) FROM idem_keys'), 101, 'reaper_enabled = off on the primary: nothing reaped there');

$standby->stop;
$primary->stop;
done_testing();
