# The background reaper (docs/contract.md §8): expired keys disappear without any call, in every database
# that has the extension (also one created after the start), settings reload on SIGHUP, the
# workers show in pg_stat_activity, come back after kill -9 / pg_terminate_backend, and leave
# DROP DATABASE alone.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use FindBin;
use lib "$FindBin::RealBin/../perl";
use IdemCrash;

my $naptime = 1;    # seconds

my $node = PostgreSQL::Test::Cluster->new('reaper');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.reaper_naptime = ${naptime}s
idempotency.reaper_batch_size = 100
max_worker_processes = 16
restart_after_crash = on
});
$node->start;

sub sql { my ($db, $sql) = @_; return $node->safe_psql($db, $sql); }

sub worker_count
{
	my ($type, $db) = @_;
	my $where = defined $db ? "AND datname = '$db'" : '';
	return sql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = '$type' $where");
}

# Keys of three kinds: expiring in 1 s with a 1 s lease (must go), live for an hour (must stay), and expired but
# pending with a live lease (must stay: someone is working on it).
sub add_keys
{
	my ($db, $prefix, $n) = @_;
	sql($db, qq{
		SELECT idem_claim('$prefix-exp-' || g, ttl => '1 second', lease => '1 second') FROM generate_series(1, $n) g;
		SELECT idem_claim('$prefix-live', ttl => '1 hour');
		SELECT idem_claim('$prefix-leased', ttl => '1 millisecond', lease => '1 hour');
	});
	return time;
}

# Waits until no key of the prefix that should expire is left; returns the seconds it took after
# the keys expired (their ttl is 1 s).
sub wait_reaped
{
	my ($db, $prefix, $created) = @_;
	my $ok = $node->poll_query_until($db,
		"SELECT count(*) = 0 FROM idem_keys WHERE key LIKE '$prefix-exp-%'");
	ok($ok, "$db: expired $prefix keys were reaped");
	return time - ($created + 1);
}

for my $db (qw(db1 db2))
{
	sql('postgres', "CREATE DATABASE $db");
	sql($db, 'CREATE EXTENSION idempotency');
}
sql('postgres', 'CREATE DATABASE noext');

# ---- the workers are there, named after their role
ok($node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'"),
	'launcher runs');
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 2 FROM pg_stat_activity
	WHERE backend_type = 'idempotency reaper' AND application_name = 'idempotency reaper'
	  AND datname IN ('db1', 'db2')}), 'one reaper in each database with the extension');
is(sql('postgres', "SELECT application_name FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'"),
	'idempotency launcher', 'launcher application_name');

# ---- expired keys disappear in both databases, within 3 naptimes, without any call
my %created = (db1 => add_keys('db1', 'a', 250), db2 => add_keys('db2', 'a', 250));
for my $db (qw(db1 db2))
{
	my $took = wait_reaped($db, 'a', $created{$db});
	note sprintf('%s: reaped %.1f s after the keys expired (naptime %d s)', $db, $took, $naptime);
	is(sql($db, "SELECT string_agg(key, ',' ORDER BY key) FROM idem_keys"), 'a-leased,a-live',
		"$db: live keys and pending keys with a live lease stay");
}
like(sql('db1', 'SELECT reaped, reaper_runs > 0, last_reap_at IS NOT NULL FROM idem_stats'),
	qr/^250\|t\|t$/, 'idem_stats counts what the reaper deleted');
# Each pass that deleted keys logs one line with its batches of at most 100, the last one short,
# after its last commit (so the line may come a moment after the keys are gone). The 250 keys
# expire within the time their INSERT took, which on a loaded machine may straddle two passes:
# the lines add up to 250.
my ($logged, @bad_batches);
my $log_deadline = time + $PostgreSQL::Test::Utils::timeout_default;
do
{
	($logged, @bad_batches) = (0);
	my @passes = slurp_file($node->logfile)
	  =~ /idempotency reaper: deleted (\d+) expired keys in database "db1" \((\d+) batches/g;
	while (my ($n, $batches) = splice(@passes, 0, 2))
	{
		$logged += $n;
		push @bad_batches, "$n keys in $batches batches" if $batches != int($n / 100) + 1;
	}
} while ($logged < 250 && time < $log_deadline && sleep 0.1);
is($logged, 250, 'the passes that deleted keys are logged: 250 keys in db1');
is(join(', ', @bad_batches), '', 'each with its batches of 100, the last one short');

# ---- a database without the extension is left alone: no reaper stays there
is(worker_count('idempotency reaper', 'noext'), 0, 'no reaper stays in a database without the extension');

# ---- a database created (with the extension) after the start is reaped too
sql('postgres', 'CREATE DATABASE db3');
sql('db3', 'CREATE EXTENSION idempotency');
my $t3 = add_keys('db3', 'b', 10);
my $took3 = wait_reaped('db3', 'b', $t3);
note sprintf('db3: reaped %.1f s after the keys expired', $took3);

# ---- SIGHUP: a longer naptime is used at once... (an hour: longer than any poll below, so that
# only the reload can explain the keys going)
sql('postgres', "ALTER SYSTEM SET idempotency.reaper_naptime = '1h'");
$node->reload;
sleep 1.5;    # the reload reaches the reapers; a pass under way ends
add_keys('db1', 'c', 5);
sleep 3.5;
is(sql('db1', "SELECT count(*) FROM idem_keys WHERE key LIKE 'c-exp-%'"), 5,
	'SIGHUP: with naptime 1h the expired keys wait for the next pass');
# ... and so is a shorter one
sql('postgres', "ALTER SYSTEM SET idempotency.reaper_naptime = '${naptime}s'");
$node->reload;
my $t0 = time;
ok($node->poll_query_until('db1', "SELECT count(*) = 0 FROM idem_keys WHERE key LIKE 'c-exp-%'"),
	'SIGHUP: back to naptime 1s, the keys go (the 1 h sleep is cut short)');
note sprintf('%.1f s after the reload', time - $t0);

# ---- reaper_enabled = off stops reaping without a restart; on starts it again
sql('postgres', 'ALTER SYSTEM SET idempotency.reaper_enabled = off');
$node->reload;
ok($node->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'idempotency reaper'"),
	'reaper_enabled = off: the reapers leave');
add_keys('db1', 'd', 5);
sleep 3.5;
is(sql('db1', "SELECT count(*) FROM idem_keys WHERE key LIKE 'd-exp-%'"), 5,
	'reaper_enabled = off: nothing is reaped');
is(worker_count('idempotency launcher'), 1, 'the launcher stays');
sql('postgres', 'ALTER SYSTEM RESET idempotency.reaper_enabled');
$node->reload;
ok($node->poll_query_until('db1', "SELECT count(*) = 0 FROM idem_keys WHERE key LIKE 'd-exp-%'"),
	'reaper_enabled = on again: reaping resumes');

# ---- reaper_databases: only the listed databases are served
sql('postgres', "ALTER SYSTEM SET idempotency.reaper_databases = 'db1'");
$node->reload;
ok($node->poll_query_until('postgres', qq{
	SELECT string_agg(datname, ',' ORDER BY datname) = 'db1' FROM pg_stat_activity
	WHERE backend_type = 'idempotency reaper'}), 'reaper_databases = db1: only db1 has a reaper');
my $te = add_keys('db3', 'e', 3);
sleep 3.5;
is(sql('db3', "SELECT count(*) FROM idem_keys WHERE key LIKE 'e-exp-%'"), 3,
	'a database not in reaper_databases is not reaped');
sql('postgres', 'ALTER SYSTEM RESET idempotency.reaper_databases');
$node->reload;
wait_reaped('db3', 'e', $te);

# ---- pg_terminate_backend of a reaper: it leaves cleanly, the launcher starts it again
ok($node->poll_query_until('postgres', "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency reaper' AND datname = 'db1'"),
	'db1 has its reaper');
my $pid = sql('postgres', "SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency reaper' AND datname = 'db1'");
sql('postgres', "SELECT pg_terminate_backend($pid)");
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 1 FROM pg_stat_activity
	WHERE backend_type = 'idempotency reaper' AND datname = 'db1' AND pid <> $pid}),
	'a terminated reaper is started again');

# ---- kill -9 of a reaper: crash restart; the launcher and the reapers come back
sub kill9_and_wait
{
	my ($type) = @_;
	my $victim = sql('postgres', "SELECT pid FROM pg_stat_activity WHERE backend_type = '$type' ORDER BY pid LIMIT 1");
	ok($victim =~ /^\d+$/, "found a $type ($victim)");
	kill 'KILL', $victim;
	# the postmaster restarts every backend: wait until it accepts connections and the
	# workers are back
	ok(poll_after_crash($node, 'postgres', qq{
			SELECT count(*) FILTER (WHERE backend_type = 'idempotency launcher') || ',' ||
			       count(*) FILTER (WHERE backend_type = 'idempotency reaper' AND datname IN ('db1', 'db2', 'db3'))
			FROM pg_stat_activity WHERE pid <> $victim}, '1,3'),
		"after kill -9 of the $type: the launcher and three reapers are back");
	ok($node->log_contains(qr/terminated by signal 9: Killed/), 'the kill was a crash');
}
kill9_and_wait('idempotency reaper');
kill9_and_wait('idempotency launcher');
my $tf = add_keys('db2', 'f', 10);
my $tookf = wait_reaped('db2', 'f', $tf);
note sprintf('after the crashes: reaped %.1f s after the keys expired', $tookf);

# ---- DROP DATABASE is not blocked by the reaper connected to it
my $td = time;
my ($rc, $out, $err) = $node->psql('postgres', 'DROP DATABASE db2');
# (a reaper that stayed would make it fail after PostgreSQL's 5 s wait for other sessions)
is($rc, 0, "DROP DATABASE of a database with a reaper works") or diag $err;
note sprintf('DROP DATABASE took %.1f s', time - $td);
# ... and ALTER DATABASE ... RENAME
($rc, $out, $err) = $node->psql('postgres', 'ALTER DATABASE db3 RENAME TO db3_renamed');
is($rc, 0, 'ALTER DATABASE RENAME of a database with a reaper works') or diag $err;
ok($node->poll_query_until('postgres', "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency reaper' AND datname = 'db3_renamed'"),
	'the renamed database gets its reaper back');

# ---- DROP EXTENSION: the reaper leaves within a naptime
sql('db1', 'DROP EXTENSION idempotency');
ok($node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'idempotency reaper' AND datname = 'db1'"),
	'after DROP EXTENSION the reaper leaves the database');

# ---- SIGTERM (fast shutdown) ends the workers cleanly
$node->stop('fast');
ok(!$node->log_contains(qr/idempotency.*(PANIC|terminated by signal 11|exited with exit code [2-9])/),
	'no worker crashed');

done_testing();
