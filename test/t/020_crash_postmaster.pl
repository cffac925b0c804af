# kill -9 of the postmaster in the middle of a 16-client transactional workload.
#
# Three rounds.  Workload (pgbench, 16 clients): BEGIN; claim; if claimed: insert the business
# row and complete the key; COMMIT (10%: ROLLBACK); half of the keys are hot (8 keys per 200 ms,
# duplicates collide all the time), half cold (a new key each time).  Next to it, one more client
# ("acker") runs the same transaction on keys of its own, one at a time, and prints each key after
# its COMMIT returned: those commits were acknowledged to a client and must survive the crash.
#
# In the middle of it the postmaster gets SIGKILL (a real kill -9 of the pid in postmaster.pid,
# not pg_ctl stop -m immediate), then its surviving children get SIGKILL too (nothing is left to
# tell them to exit), and the node is started again: crash recovery replays the WAL.
#
# Afterwards: every succeeded key has exactly one business row written by the attempt that
# completed it, no business row lacks its succeeded key, no pending key is left, every
# acknowledged key is there, the indexes are consistent (amcheck), the functions work, and the
# background reaper is running again and reaps a newly expired key.
#
# pgbench reports client errors when the server dies: that is expected, so its exit status is not
# asserted; the data is.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use POSIX qw(WNOHANG);
use Time::HiRes qw(time sleep);
use Config;

# A postmaster killed with SIGKILL is re-parented to the nearest "subreaper" ancestor, or to
# PID 1.  Some container inits never reap orphans; the zombie would then keep its pid, and the
# new postmaster would refuse to start ("lock file already exists").  Become the subreaper of our
# own descendants (prctl PR_SET_CHILD_SUBREAPER, Linux) so that this test can reap what it kills,
# as a real init would.
sub become_subreaper
{
	my %prctl = (x86_64 => 157, aarch64 => 167);
	my ($arch) = $Config{archname} =~ /^(\w+?)-/;
	return 0 unless defined $arch && exists $prctl{$arch};
	return syscall($prctl{$arch}, 36, 1, 0, 0, 0) == 0;    # PR_SET_CHILD_SUBREAPER = 36
}
my $subreaper = become_subreaper();
note "test process is a child subreaper: " . ($subreaper ? 'yes' : 'no');

my $node = PostgreSQL::Test::Cluster->new('crash_postmaster');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
max_connections = 40
fsync = on
log_statement = none
idempotency.reaper_naptime = 1s
log_min_messages = warning
});
$node->start;

sub query { return $node->safe_psql('postgres', $_[0]); }

query(q{
CREATE EXTENSION idempotency;
CREATE EXTENSION amcheck;
-- deliberately no unique constraint: a duplicate shows up as a second row
CREATE TABLE orders (key text NOT NULL, attempt integer NOT NULL, client_id integer NOT NULL);
CREATE INDEX ON orders (key);
});

ok($node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency reaper' AND datname = 'postgres'"),
	'before the crash: the reaper runs');

# A dead process: gone, or a zombie.  Reap it if it is ours (we are the subreaper).
sub is_dead
{
	my ($pid) = @_;
	return 1 if waitpid($pid, WNOHANG) == $pid;
	return 1 unless kill(0, $pid);
	if (open(my $fh, '<', "/proc/$pid/stat"))
	{
		my $stat = <$fh>;
		close $fh;
		return 1 if defined $stat && $stat =~ /\)\s+Z\s/;
	}
	return 0;
}

sub wait_dead
{
	my (@pids) = @_;
	my $deadline = time + 60;
	while (time < $deadline)
	{
		@pids = grep { !is_dead($_) } @pids;
		return 1 unless @pids;
		sleep 0.05;
	}
	diag "still alive: @pids";
	return 0;
}

# The children of a process (read from /proc before the kill: afterwards they are re-parented).
sub children_of
{
	my ($ppid) = @_;
	my @kids;
	opendir(my $dh, '/proc') or die "cannot read /proc: $!";
	for my $p (grep { /^\d+$/ } readdir $dh)
	{
		open(my $fh, '<', "/proc/$p/stat") or next;
		my $stat = <$fh>;
		close $fh;
		next unless defined $stat;
		# "pid (comm) state ppid ...": comm may contain spaces and parentheses
		my ($rest) = $stat =~ /\)\s+(.*)$/ or next;
		my (undef, $parent) = split /\s+/, $rest;
		push @kids, $p if $parent == $ppid;
	}
	closedir $dh;
	return @kids;
}

# The pgbench script of a round.  Half of the transactions use a hot key: one of 8 keys of the
# current 200 ms time slot, so that duplicates collide all the time (a claimer waits for the
# inserting transaction, then replays or, after a rollback, claims); the other half use a cold key
# among 100000 (a new claim almost every time).  The claim, the business row and the completion
# are one transaction: work() does them, the script commits it or (10%) rolls it back.
$node->safe_psql('postgres', q{
CREATE FUNCTION work(p_key text, p_client integer) RETURNS idem_outcome LANGUAGE plpgsql AS $$
DECLARE
    c idem_claim_result;
BEGIN
    c := idem_claim(p_key, jsonb_build_object('k', p_key));
    IF c.outcome = 'claimed' THEN
        INSERT INTO orders VALUES (p_key, c.attempt, p_client);
        PERFORM idem_complete(p_key, jsonb_build_object('client', p_client), 201, attempt => c.attempt);
    END IF;
    RETURN c.outcome;
END
$$;
});

sub workload_script
{
	my ($prefix) = @_;
	my $file = $node->basedir . "/workload_$prefix.sql";
	PostgreSQL::Test::Utils::append_to_file($file, qq{
\\set hot random(0, 1)
\\set k random(1, 8)
\\set c random(1, 100000)
\\set r random(1, 10)
BEGIN;
SELECT work(CASE WHEN :hot = 1
                 THEN '${prefix}h' || floor(extract(epoch FROM clock_timestamp()) * 5)::bigint || '-' || :k
                 ELSE '${prefix}c' || :c END,
            :client_id);
\\if :r = 1
ROLLBACK;
\\else
COMMIT;
\\endif
});
	return $file;
}

my @all_acked;
for my $round (1 .. 3)
{
	my $p = "r$round";    # this round's pgbench keys: r1h<slot>-<k>, r1c<n>
	# ---- the workload
	my ($bench_out, $bench_err) = ('', '');
	my $bench = IPC::Run::start(
		[
			'pgbench', '-n', '-c', 16, '-j', 4, '-T', 120, '-f', workload_script($p),
			'-h', $node->host, '-p', $node->port, 'postgres'
		],
		'>', \$bench_out, '2>', \$bench_err,
		IPC::Run::timeout(180));

	# the acker: sequential transactions on keys of its own; "ack <key>" after each COMMIT
	# returned
	my $acker_file = $node->basedir . "/acker$round.sql";
	open(my $af, '>', $acker_file) or die "cannot write $acker_file: $!";
	for my $i (1 .. 20_000)
	{
		my $k = "r${round}a$i";
		print $af qq{BEGIN;
SELECT 1 FROM idem_claim('$k', '{"acker": true}') WHERE outcome = 'claimed';
INSERT INTO orders VALUES ('$k', 1, -1);
SELECT 1 FROM idem_complete('$k', '{"acker": true}', 201, attempt => 1);
COMMIT;
\\echo ack $k
};
	}
	close $af;
	my ($ack_out, $ack_err) = ('', '');
	my $acker = IPC::Run::start(
		[
			'psql', '-X', '-q', '-A', '-t', '-v', 'ON_ERROR_STOP=1', '-f', $acker_file,
			'-h', $node->host, '-p', $node->port, '-d', 'postgres'
		],
		'<', \undef, '>', \$ack_out, '2>', \$ack_err,
		IPC::Run::timeout(180));

	# let the workload run for 1.5, 2 or 2.5 s (and until pgbench committed 100 business rows)
	my $t0 = time;
	my $committed = 0;
	while (time - $t0 < 60)
	{
		$bench->pump_nb;
		$acker->pump_nb;
		$committed = query("SELECT count(*) FROM orders WHERE key LIKE '${p}%'");
		last if time - $t0 >= 1 + $round / 2 && $committed >= 100;
		sleep 0.1;
	}
	note "round $round: business rows committed by pgbench before the crash: $committed ("
	  . query("SELECT count(*) FROM orders WHERE key LIKE '${p}h%'") . " on hot keys)";
	cmp_ok($committed, '>=', 100, "round $round: pgbench committed 100 business rows before the crash");

	# ---- kill -9 of the postmaster
	my $pidfile = $node->data_dir . '/postmaster.pid';
	my ($pm_pid) = split /\n/, slurp_file($pidfile);
	is($pm_pid, $node->{_pid}, "round $round: postmaster.pid names the running postmaster");
	my @children = children_of($pm_pid);
	note "round $round: postmaster $pm_pid has " . scalar(@children) . " children";
	cmp_ok(scalar(@children), '>=', 17,
		"round $round: the postmaster has its 17 clients and its workers as children");

	ok(kill('KILL', $pm_pid), "round $round: SIGKILL sent to the postmaster");
	$node->{_pid} = undef;    # as far as Cluster.pm is concerned, the node is down
	ok(wait_dead($pm_pid), "round $round: the postmaster is dead");
	# nobody is left to tell the children to exit: kill them as an operator would
	kill('KILL', grep { !is_dead($_) } @children);
	ok(wait_dead(@children), "round $round: its children are dead");

	$bench->finish;
	$acker->finish;
	note "round $round: pgbench stdout:\n$bench_out";
	note "round $round: pgbench stderr (errors expected):\n" . substr($bench_err, 0, 2000);
	# the only errors are the ones the crash caused: no SQL error (ERROR:) before it
	unlike($bench_err, qr/ERROR:/, "round $round: pgbench clients saw no SQL error, only the crash");
	unlike($ack_err, qr/ERROR:/, "round $round: the acker saw no SQL error, only the crash");
	my @acked = $ack_out =~ /^ack (\S+)$/mg;
	note "round $round: acknowledged acker commits: " . scalar(@acked);
	cmp_ok(scalar(@acked), '>=', 1, "round $round: the acker had commits acknowledged");
	push @all_acked, @acked;

	# A killed postmaster keeps its pid until its parent reaps it, and its lock file blocks the
	# start meanwhile: give the reaping (ours or another's) a moment, then treat a zombie that is
	# still there as the dead process it is.
	my $reap_deadline = time + 10;
	sleep 0.05
	  while kill(0, $pm_pid) && waitpid($pm_pid, WNOHANG) != $pm_pid && time < $reap_deadline;
	if (kill(0, $pm_pid))
	{
		note 'the dead postmaster is an unreaped zombie: removing its stale lock files';
		unlink $pidfile;
		unlink glob($node->host . '/.s.PGSQL.' . $node->port . '.lock');
	}

	# ---- restart: crash recovery
	my $logstart = -s $node->logfile;
	$node->start;
	ok($node->log_contains(qr/database system was interrupted|was not properly shut down/, $logstart),
		"round $round: the start was a crash recovery");
	ok($node->log_contains(qr/redo (starts|done) at/, $logstart), "round $round: WAL was replayed");

	# ---- the data
	is(query(q{SELECT count(*) FROM idem_keys WHERE state <> 'succeeded'}), '0',
		"round $round: no pending (or failed) key is left: the crash rolled back every open claim");
	is(query(q{SELECT count(*) FROM (SELECT key FROM orders GROUP BY key HAVING count(*) > 1) d}), '0',
		"round $round: no duplicate business row");
	is( query(q{SELECT count(*) FROM idem_keys k
		         LEFT JOIN (SELECT key, count(*) AS n FROM orders GROUP BY key) o ON o.key = k.key
		         WHERE coalesce(o.n, 0) <> 1}),
		'0', "round $round: every succeeded key has exactly one business row");
	is( query(q{SELECT count(*) FROM orders o
		         WHERE NOT EXISTS (SELECT FROM idem_keys k
		                           WHERE k.scope = '' AND k.key = o.key AND k.state = 'succeeded')}),
		'0', "round $round: no business row lacks its succeeded key");
	is( query(q{SELECT count(*) FROM orders o JOIN idem_keys k ON k.scope = '' AND k.key = o.key
		         WHERE k.attempt <> 1 OR o.attempt <> 1 OR k.response_code <> 201
		            OR k.response <> CASE WHEN o.client_id < 0 THEN '{"acker": true}'
		                                  ELSE jsonb_build_object('client', o.client_id) END}),
		'0', "round $round: each key holds the response of the transaction that wrote its business row");
	my $acked_list = join(',', map { "'$_'" } @all_acked);
	is( query(qq{SELECT count(*) FROM idem_keys k JOIN orders o ON o.key = k.key
		          WHERE k.scope = '' AND k.key IN ($acked_list) AND k.state = 'succeeded'}),
		scalar(@all_acked),
		"round $round: every acknowledged commit (all rounds: " . scalar(@all_acked) . ") is there");
	like( query(q{SELECT string_agg(c.relname, ',' ORDER BY c.relname)
		          FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam
		          CROSS JOIN LATERAL bt_index_check(c.oid, true)
		         WHERE i.indrelid = 'idem_keys'::regclass AND am.amname = 'btree'}),
		qr/\bidem_keys_pkey\b/,
		"round $round: amcheck: the btree indexes of idem_keys (the primary key among them) are consistent with the heap");
}
my $keys = query(q{SELECT count(*) FROM idem_keys});
note "keys after the last recovery: $keys";

# ---- the functions work on the recovered table
my $some = query(q{SELECT key FROM idem_keys WHERE key LIKE 'r3c%' ORDER BY key LIMIT 1});
like(query(qq{SELECT outcome, inserted, state, response_code FROM idem_claim('$some', jsonb_build_object('k', '$some'))}),
	qr/^replay\|f\|succeeded\|201$/, 'a retry of a recovered key replays its response');
is(query(q{SELECT outcome || ',' || inserted || ',' || attempt FROM idem_claim('after-crash')}),
	'claimed,true,1', 'a new key is claimed');
is(query(q{SELECT state FROM idem_complete('after-crash', '{}')}), 'succeeded', 'and completed');

# ---- the reaper is running again and reaps
ok($node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'"),
	'after recovery the launcher runs');
ok($node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency reaper' AND datname = 'postgres'"),
	'after recovery the reaper runs in the database');
query(q{SELECT idem_claim('expire-me', ttl => '1 millisecond', lease => '1 millisecond')});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM idem_keys WHERE key = 'expire-me'}),
	'a newly expired key is reaped by the background worker');
is(query(q{SELECT count(*) FROM idem_keys}), $keys + 1, 'nothing else was reaped');

$node->stop;
done_testing();
