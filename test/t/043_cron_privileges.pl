# Scheduling the reaper with pg_cron, as a role that is not a superuser (docs/security.md):
# - pg_cron's grants decide who may schedule: without USAGE on schema cron and EXECUTE on
#   cron.schedule_in_database (neither is PUBLIC's), idem_schedule_reaper() raises 42501;
# - with it, the job belongs to that role and runs as that role, with that role's privileges: in a
#   database where it has DELETE on idem_keys the job reaps, where it has not the job fails with
#   "permission denied for table idem_keys" (recorded by pg_cron) and nothing is deleted;
# - another role's idem_unschedule_reaper() does not remove it.
# pg_cron 1.4 runs jobs at minute boundaries: this waits for one.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use IdemCronNode;

my $node = start_cron_node('cron_privileges');

sub sql { my ($db, $q) = @_; return $node->safe_psql($db, $q); }
sub as
{
	my ($db, $role, $q) = @_;
	my ($rc, $out, $err) = $node->psql($db, $q, extra_params => [ '-U', $role ]);
	return ($out, $err);
}

sql('postgres', q{
	CREATE EXTENSION pg_cron;
	CREATE EXTENSION idempotency;
	CREATE ROLE scheduler LOGIN;
	CREATE ROLE other LOGIN;
	CREATE DATABASE app;
});
sql('app', q{CREATE EXTENSION idempotency; GRANT DELETE ON idem_keys TO scheduler;});

# 1. pg_cron's own grants decide who may schedule
my ($out, $err) = as('postgres', 'scheduler', 'SELECT idem_schedule_reaper()');
like($err, qr/ERROR:  permission denied for schema cron/, 'without USAGE on schema cron: 42501');
sql('postgres', q{GRANT USAGE ON SCHEMA cron TO scheduler, other});
($out, $err) = as('postgres', 'scheduler', 'SELECT idem_schedule_reaper()');
like($err, qr/ERROR:  permission denied for function schedule_in_database/,
	'without EXECUTE on cron.schedule_in_database: 42501');
is(sql('postgres', 'SELECT count(*) FROM cron.job'), 0, 'no job');

sql('postgres', q{GRANT EXECUTE ON FUNCTION cron.schedule_in_database(text, text, text, text, text, boolean) TO scheduler});
($out, $err) = as('postgres', 'scheduler', 'SELECT idem_schedule_reaper()');
like($out, qr/^\d+$/, 'with it: idem_schedule_reaper() schedules the job in this database') or diag $err;
# and, as the HINT of another database says, the job for database app
($out, $err) = as('app', 'scheduler', 'SELECT idem_schedule_reaper()');
my ($call) = $err =~ /HINT:  .*run: (SELECT cron\.schedule_in_database\(.*\);)/;
($out, $err) = as('postgres', 'scheduler', $call);
like($out, qr/^\d+$/, 'and the job for database app, with the HINT\'s call') or diag $err;
is(sql('postgres', q{SELECT string_agg(database || ':' || username, ' ' ORDER BY database) FROM cron.job}),
	'app:scheduler postgres:scheduler', 'both jobs belong to the role that scheduled them');

# 2. another role cannot remove them
($out, $err) = as('postgres', 'other', 'SELECT idem_unschedule_reaper()');
is($out, 'f', 'another role\'s idem_unschedule_reaper() finds no job of its own') or diag $err;
is(sql('postgres', 'SELECT count(*) FROM cron.job'), 2, 'the jobs are still there');

# 3. the jobs run as the scheduler: DELETE in app, not in postgres
for my $db (qw(postgres app))
{
	sql($db, q{SELECT idem_claim('exp-' || g, ttl => '1 millisecond', lease => '1 millisecond') FROM generate_series(1, 20) g});
}
ok($node->poll_query_until('postgres',
	q{SELECT count(DISTINCT j.database) = 2 FROM cron.job_run_details d JOIN cron.job j USING (jobid)
	  WHERE d.status IN ('succeeded', 'failed')}),
	'both jobs ran (at the next minute boundary)');
like(sql('postgres', q{SELECT d.status || ': ' || d.return_message FROM cron.job_run_details d JOIN cron.job j USING (jobid)
	WHERE j.database = 'postgres' ORDER BY d.runid LIMIT 1}),
	qr/^failed: ERROR: +permission denied for table idem_keys/,
	'without DELETE on idem_keys the job fails, and pg_cron records why');
is(sql('postgres', q{SELECT count(*) FROM idem_keys}), 20, '... and nothing was deleted');
is(sql('postgres', q{SELECT d.status || ' ' || coalesce(d.return_message, '') FROM cron.job_run_details d JOIN cron.job j USING (jobid)
	WHERE j.database = 'app' ORDER BY d.runid LIMIT 1}), 'succeeded CALL', 'with DELETE the job succeeds');
is(sql('app', q{SELECT count(*) FROM idem_keys}), 0, '... and reaped');

# 4. the owner removes its job
($out, $err) = as('postgres', 'scheduler', 'SELECT idem_unschedule_reaper()');
is($out, 't', 'the scheduler\'s idem_unschedule_reaper() removes its job') or diag $err;
is(sql('postgres', q{SELECT string_agg(database, ' ') FROM cron.job}), 'app', 'only the app job is left');

$node->stop;
done_testing();
