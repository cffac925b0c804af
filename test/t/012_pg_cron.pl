# The pg_cron alternative: idem_schedule_reaper() in the pg_cron database creates (or replaces)
# one job that really reaps, idem_unschedule_reaper() removes it; in another database both
# functions fail with a HINT giving the exact call to run in the pg_cron database, and that call
# works. pg_cron 1.4 schedules by the minute: this test waits for one minute boundary.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use IdemCronNode;

my $node = start_cron_node('cron');

sub sql { my ($db, $q) = @_; return $node->safe_psql($db, $q); }

sql('postgres', 'CREATE EXTENSION pg_cron');
sql('postgres', 'CREATE EXTENSION idempotency');
sql('postgres', 'CREATE DATABASE app');
sql('app', 'CREATE EXTENSION idempotency');

# ---- in the pg_cron database
my $job = sql('postgres', 'SELECT idem_schedule_reaper()');
like($job, qr/^\d+$/, "idem_schedule_reaper returns the job id ($job)");
is(sql('postgres', "SELECT jobname || '|' || schedule || '|' || command || '|' || database FROM cron.job"),
	'idempotency reaper: postgres|* * * * *|CALL public.idem_reap_all()|postgres', 'the job');
is(sql('postgres', q{SELECT idem_schedule_reaper('*/1 * * * *')}), $job, 'scheduling again replaces the job');
is(sql('postgres', 'SELECT schedule FROM cron.job'), '*/1 * * * *', 'with the new schedule');

# ---- in another database: the HINT's call, run in the pg_cron database
my ($rc, $out, $err) = $node->psql('app', 'SELECT idem_schedule_reaper()');
isnt($rc, 0, 'idem_schedule_reaper without pg_cron in this database fails');
like($err, qr/ERROR:  pg_cron is not installed in database "app"/, 'saying why');
my ($call) = $err =~ /HINT:  .*run: (SELECT cron\.schedule_in_database\(.*\);)/;
is($call, q{SELECT cron.schedule_in_database('idempotency reaper: app', '* * * * *', 'CALL public.idem_reap_all()', 'app');},
	'the HINT gives the exact cron.schedule_in_database call');
my $appjob = sql('postgres', $call);
like($appjob, qr/^\d+$/, 'the hinted call works in the pg_cron database');

# ---- the jobs really reap (at the next minute boundary)
for my $db (qw(postgres app))
{
	sql($db, q{SELECT idem_claim('exp-' || g, ttl => '1 millisecond', lease => '1 millisecond')
	           FROM generate_series(1, 50) g});
	sql($db, q{SELECT idem_claim('live', ttl => '1 hour')});
}
for my $db (qw(postgres app))
{
	ok($node->poll_query_until($db, q{SELECT count(*) = 1 FROM idem_keys}), "$db: the cron job reaped the expired keys");
	is(sql($db, 'SELECT key FROM idem_keys'), 'live', "$db: the live key stays");
}
ok($node->poll_query_until('postgres',
	q{SELECT count(DISTINCT database) = 2 FROM cron.job_run_details WHERE status = 'succeeded'}),
	'cron.job_run_details: both jobs succeeded');
is(sql('postgres', 'SELECT reaped FROM idem_stats'), 50, 'idem_stats counts what the job reaped');
is(sql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency reaper'}), 0,
	'the background reaper is off (the cron job did it)');

# ---- unschedule
is(sql('postgres', 'SELECT idem_unschedule_reaper()'), 't', 'idem_unschedule_reaper removes the job');
is(sql('postgres', 'SELECT idem_unschedule_reaper()'), 'f', 'and says when there was none');
is(sql('postgres', 'SELECT string_agg(jobname, \',\') FROM cron.job'), 'idempotency reaper: app', 'the other job stays');
($rc, $out, $err) = $node->psql('app', 'SELECT idem_unschedule_reaper()');
isnt($rc, 0, 'idem_unschedule_reaper without pg_cron in this database fails');
($call) = $err =~ /HINT:  .*run: (SELECT cron\.unschedule\(.*\);)/;
is($call, q{SELECT cron.unschedule('idempotency reaper: app');}, 'the HINT gives the exact cron.unschedule call');
sql('postgres', $call);
is(sql('postgres', 'SELECT count(*) FROM cron.job'), 0, 'no job left');

$node->stop;
done_testing();
