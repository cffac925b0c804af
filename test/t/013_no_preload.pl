# Without shared_preload_libraries: no worker, every function works, idem_stats answers with NULL
# counters and idem_scope_stats with no rows (after claims, completions, failures and reaps in two
# scopes), both resets are no-ops, and the scheduling functions explain pg_cron. (The regression
# suite runs preloaded and checks the counting itself: sql/stats.sql, sql/scope_stats.sql.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

my $node = PostgreSQL::Test::Cluster->new('no_preload');
$node->init;
$node->append_conf('postgresql.conf', 'idempotency.reaper_naptime = 1s');
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

sub sql { return $node->safe_psql('postgres', $_[0]); }

is(sql(q{SELECT (idem_claim('k1', '{"a": 1}')).outcome}), 'claimed', 'idem_claim');
is(sql(q{SELECT (idem_claim('k1', '{"a": 1}')).outcome}), 'in_progress', 'idem_claim again');
is(sql(q{SELECT state FROM idem_complete('k1', '{"ok": true}')}), 'succeeded', 'idem_complete');
is(sql(q{SELECT (idem_claim('k1', '{"a": 1}')).outcome}), 'replay', 'replay');
sql(q{SELECT idem_claim('k2')});
is(sql(q{SELECT state FROM idem_fail('k2')}), 'failed', 'idem_fail');
is(sql(q{SELECT (idem_lookup('k1')).response}), '{"ok": true}', 'idem_lookup');
sql(q{SELECT idem_claim('x' || g, ttl => '1 millisecond', lease => '1 millisecond') FROM generate_series(1, 30) g});
sleep 0.1;
is(sql(q{SELECT idem_reap(10)}), 10, 'idem_reap');
is(sql(q{CALL idem_reap_all(7)}), 20, 'idem_reap_all');

sql(q{SELECT idem_claim('s1', scope => 'named'); SELECT idem_complete('s1', '{}', scope => 'named')});
is(sql(q{SELECT (idem_claim('s1', scope => 'named')).outcome}), 'replay', 'a replay in a second scope');

is(sql(q{SELECT row(s.*)::text FROM idem_stats s}), '(,,,,,,,,,,,,)', 'idem_stats: one row, every counter NULL');
is(sql(q{SELECT count(*) FROM idem_stats}), 1, 'exactly one row');
sql(q{SELECT idem_stats_reset()});
is(sql(q{SELECT stats_reset IS NULL FROM idem_stats}), 't', 'idem_stats_reset: nothing to reset');
is(sql(q{SELECT count(*) FROM idem_scope_stats}), 0, 'idem_scope_stats: no rows');
sql(q{SELECT idem_scope_stats_reset()});
is(sql(q{SELECT count(*) FROM idem_scope_stats}), 0, 'idem_scope_stats_reset: nothing to reset');
is(sql(q{SELECT (idem_claim('k3')).outcome}), 'claimed', 'a claim');
is(sql(q{SELECT retry_after_s FROM idem_claim('k3', lease => '1 minute')}), 60,
	'retry_after_s: the lease left, ceil(retry_after)');

my ($rc, $out, $err) = $node->psql('postgres', 'SELECT idem_schedule_reaper()');
isnt($rc, 0, 'idem_schedule_reaper without pg_cron fails');
like($err, qr/HINT:  .*SELECT cron\.schedule_in_database\('idempotency reaper: postgres', '\* \* \* \* \*', 'CALL public\.idem_reap_all\(\)', 'postgres'\);/,
	'its HINT gives the exact cron.schedule_in_database call');

# the expired keys left stay: nobody reaps without the library preloaded
sql(q{SELECT idem_claim('y' || g, ttl => '1 millisecond', lease => '1 millisecond') FROM generate_series(1, 5) g});
sleep 3;
is(sql(q{SELECT count(*) FROM idem_keys WHERE key LIKE 'y%'}), 5, 'no background reaping');
is(sql(q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency%'}), 0, 'no worker');
ok(!$node->log_contains(qr/background worker "idempotency|idempotency reaper: deleted/), 'no worker in the log');

$node->stop;
done_testing();
