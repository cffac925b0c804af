# prometheus-postgres-exporter with queries.yaml, connected as the role exporter-role.sql makes,
# against a cluster that ran a scripted workload: every series and its exact value on /metrics
# (real HTTP on loopback), then after idem_stats_reset() and a few more claims, again; with
# per-scope export on (and every metric alerts.yml and grafana-dashboard.json use), then off.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use File::Basename qw(dirname);
use File::Spec;
use HTTP::Tiny;
use JSON::PP;
use POSIX qw(:sys_wait_h);
use Time::HiRes qw(sleep);

my $part = File::Spec->rel2abs(dirname(__FILE__) . '/..');
my $queries = "$part/queries.yaml";
my $role_sql = "$part/exporter-role.sql";
my $exporter_bin = $ENV{POSTGRES_EXPORTER} // 'prometheus-postgres-exporter';

my $node = PostgreSQL::Test::Cluster->new('monitoring');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
# reaps are counted exactly: only the test's idem_reap() call deletes keys
idempotency.reaper_enabled = off
});
$node->start;

# The extension in a schema of its own: the role's search_path (exporter-role.sql) must find it.
$node->safe_psql('postgres', 'CREATE DATABASE app');
$node->safe_psql('app', q{
CREATE SCHEMA idem;
CREATE EXTENSION idempotency SCHEMA idem;
});
$node->command_ok(
	[ 'psql', '-X', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('app'), '-f', $role_sql ],
	'exporter-role.sql runs');
$node->command_ok(
	[ 'psql', '-X', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('app'), '-f', $role_sql ],
	'exporter-role.sql runs again (an existing role is kept)');

# ---- least privilege: the role reads what the queries need and nothing else
sub as_exporter
{
	my ($sql) = @_;
	my ($rc, $out, $err) = $node->psql('app', $sql,
		extra_params => [ '-U', 'idempotency_exporter', '-v', 'VERBOSITY=sqlstate' ]);
	return ($rc, $out, $err);
}
my ($rc, $out, $err) = as_exporter('SELECT claims FROM idem_stats');
is($rc, 0, 'exporter role reads idem_stats through its search_path');
($rc, $out, $err) = as_exporter('SELECT count(state), min(created_at), max(locked_until), max(expires_at) FROM idem_keys');
is($rc, 0, 'exporter role reads the four columns the queries use');
for my $column (qw(scope key fingerprint response))
{
	($rc, $out, $err) = as_exporter("SELECT $column FROM idem_keys");
	like($err, qr/42501/, "exporter role cannot read idem_keys.$column");
}
($rc, $out, $err) = as_exporter("SELECT idem_stats_reset()");
like($err, qr/42501/, 'exporter role cannot reset the statistics');
($rc, $out, $err) = as_exporter("SELECT idem_claim('x')");
like($err, qr/25006|42501/, 'exporter role cannot claim a key');
is($node->safe_psql('app', q{
	SELECT rolsuper OR rolcreaterole OR rolcreatedb OR rolreplication OR rolbypassrls
	       OR pg_has_role('idempotency_exporter', 'pg_monitor', 'member')
	FROM pg_roles WHERE rolname = 'idempotency_exporter'}),
	'f', 'exporter role has no attribute and no pg_monitor');

# ---- the scripted workload (counts in comments: claims, inserted, replays, in_progress, ...)
sub app { return $node->safe_psql('app', $_[0]); }

sub claim_mismatch
{
	my ($key, $request) = @_;
	my ($rc, $out, $err) = $node->psql('app', "SELECT idem_claim('$key', '$request', scope => 'tenant-acme')",
		extra_params => [ '-v', 'VERBOSITY=sqlstate' ]);
	like($err, qr/IK001/, "claim of $key with another request: IK001");
}

sub outcome
{
	my ($key, $args) = @_;
	$args = defined $args ? ", $args" : '';
	return app("SELECT outcome, inserted FROM idem_claim('$key', scope => 'tenant-acme'$args)");
}

$node->safe_psql('app', 'ALTER DATABASE app SET search_path = idem, public');
# the checks above may have counted (a refused claim): count the workload from a reset
my $before_reset1 = app(q{SELECT date_part('epoch', clock_timestamp())});
app('SELECT idem_stats_reset()');
my $after_reset1 = app(q{SELECT date_part('epoch', clock_timestamp())});
is(outcome('order-1', q{request => '{"a": 1}'}), 'claimed|t', 'order-1 claimed');    # inserted
is(outcome('order-1', q{request => '{"a": 1}'}), 'in_progress|f', 'order-1 in progress');
app(q{SELECT idem_complete('order-1', '{"id": 1}', scope => 'tenant-acme')});     # complete
is(outcome('order-1', q{request => '{"a": 1}'}), 'replay|f', 'order-1 replayed');
claim_mismatch('order-1', '{"a": 2}');                                             # mismatch
is(outcome('order-2'), 'claimed|t', 'order-2 claimed');                            # inserted
app(q{SELECT idem_fail('order-2', scope => 'tenant-acme')});                      # fail (retryable)
# Leases taken over last an hour, longer than the test however slow the machine: order-2 answers
# in_progress after the reset, and only order-5 is ever stalled.
is(outcome('order-2', q{lease => '1 hour'}), 'claimed|f', 'order-2 taken over after a retryable failure'); # takeover
is(outcome('order-3', q{lease => '1 millisecond'}), 'claimed|t', 'order-3 claimed with a short lease');
ok($node->poll_query_until('app',
	q{SELECT locked_until < clock_timestamp() FROM idem_keys WHERE key = 'order-3'}),
	'order-3 lease ended');
is(outcome('order-3', q{lease => '1 hour'}), 'claimed|f', 'order-3 taken over after its lease ended'); # takeover
is(outcome('order-4'), 'claimed|t', 'order-4 claimed');                            # inserted
app(q{SELECT idem_fail('order-4', retryable => false, scope => 'tenant-acme')});  # fail
is(outcome('order-4'), 'replay|f', 'order-4 replays its failure');                 # replay
# a key whose owner went away: its lease ended, nobody finished it (a row of idem_stalled)
is(outcome('order-5', q{lease => '1 millisecond'}), 'claimed|t', 'order-5 claimed, then abandoned'); # inserted
# three keys that expire 5 s after their claim, completed at once (an expired key cannot be)
for my $i (1 .. 3)
{
	is(app(qq{SELECT outcome, inserted FROM idem_claim('short-$i', scope => 'tenant-acme', ttl => '5 seconds');
	          SELECT state FROM idem_complete('short-$i', '{}', scope => 'tenant-acme')}),
		"claimed|t\nsucceeded", "short-$i claimed and completed");            # inserted, complete
}
ok($node->poll_query_until('app',
	q{SELECT count(*) = 3 FROM idem_keys WHERE key LIKE 'short-%' AND expires_at <= clock_timestamp()}),
	'the three short keys expired');
my $before_reap = app('SELECT date_part(\'epoch\', clock_timestamp())');
is(app('SELECT idem_reap(2)'), '2', 'idem_reap(2) deletes two of them');          # reaped 2, 1 run
my $after_reap = app('SELECT date_part(\'epoch\', clock_timestamp())');
# the oldest pending key: claimed an hour ago (as far as the table knows); order-5 stalled for
# ten minutes
app(q{UPDATE idem_keys SET created_at = created_at - interval '1 hour' WHERE key = 'order-3'});
app(q{UPDATE idem_keys SET locked_until = locked_until - interval '10 minutes' WHERE key = 'order-5'});
is(app('SELECT key FROM idem_stalled'), 'order-5', 'idem_stalled lists order-5');

# a second database, scraped through a second DSN: its own series (datname label)
$node->safe_psql('postgres', 'CREATE DATABASE billing');
$node->safe_psql('billing', 'CREATE EXTENSION idempotency');
$node->command_ok(
	[ 'psql', '-X', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('billing'), '-f', $role_sql ],
	'exporter-role.sql runs in a second database');
$node->safe_psql('billing', q{SELECT idem_claim('invoice-1')});

my %stats = (
	claims => 14, inserted => 8, replays => 2, in_progress => 1, takeovers => 2,
	mismatches => 1, completes => 4, fails => 2, reaped => 2, reaper_runs => 1);
is(app('SELECT ' . join(', ', sort keys %stats) . ' FROM idem_stats'),
	join('|', map { $stats{$_} } sort keys %stats), 'idem_stats counted the workload');

# ---- the exporter, on a free loopback port (scripts/cluster's, reserved for this process)
sub free_port
{
	my $port = `bash $part/../../scripts/cluster port --holder $$`;
	$? == 0 && $port =~ /^(\d+)$/ or die 'no free port for the exporter';
	return $1;
}
my $port = free_port();
my $exporter_log = "$PostgreSQL::Test::Utils::log_path/exporter.log";
my $exporter_pid;
# the built-in collectors this exporter release enables (no-builtin-collectors), all turned off
my @builtin_off = split ' ', `$part/no-builtin-collectors`;
die 'no-builtin-collectors failed' if $? != 0 || !@builtin_off;

sub start_exporter
{
	my $pid = fork() // die "fork: $!";
	if ($pid == 0)
	{
		open(STDOUT, '>>', $exporter_log) or die $!;
		open(STDERR, '>&', \*STDOUT) or die $!;
		# one DSN per database, comma-separated
		$ENV{DATA_SOURCE_NAME} = join(',', map {
			'host=' . $node->host . ' port=' . $node->port
			  . " user=idempotency_exporter dbname=$_ sslmode=disable" } qw(app billing));
		exec($exporter_bin, '--disable-default-metrics', '--disable-settings-metrics',
			@builtin_off,
			"--extend.query-path=$queries", "--web.listen-address=127.0.0.1:$port",
			'--log.level=info')
		  or die "exec $exporter_bin: $!";
	}
	$exporter_pid = $pid;
}

sub stop_exporter
{
	return unless $exporter_pid;
	kill 'TERM', $exporter_pid;
	for (1 .. 100)
	{
		last if waitpid($exporter_pid, WNOHANG) != 0;
		sleep 0.1;
	}
	if (waitpid($exporter_pid, WNOHANG) == 0)
	{
		kill 'KILL', $exporter_pid;
		waitpid($exporter_pid, 0);
	}
	$exporter_pid = undef;
}
END { stop_exporter(); }
# interrupted: leave through exit, so that the END blocks stop the exporter and the cluster
$SIG{INT} = $SIG{TERM} = sub { exit 1; };

my $http = HTTP::Tiny->new(timeout => 60);

# One scrape: { name => [ { labels => {...}, value => n } ] } and { name => type }.
sub scrape
{
	my ($response, $tries) = (undef, 0);
	# the exporter listens shortly after it starts: bounded retries
	until (($response = $http->get("http://127.0.0.1:$port/metrics"))->{status} == 200 or ++$tries >= 100)
	{
		sleep 0.2;
	}
	die "scrape failed: $response->{status} $response->{reason}\n$response->{content}"
	  unless $response->{status} == 200;
	my (%series, %type);
	for my $line (split /\n/, $response->{content})
	{
		if ($line =~ /^# TYPE (\S+) (\S+)$/) { $type{$1} = $2; next; }
		next if $line =~ /^#/ or $line eq '';
		$line =~ /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/ or die "bad line: $line";
		my ($name, $labels, $value) = ($1, $2 // '', $3);
		my %l = $labels =~ /([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"/g;
		push @{ $series{$name} }, { labels => \%l, value => $value };
	}
	return { series => \%series, type => \%type, text => $response->{content} };
}

# The value of the one series of $name whose labels include %want.
sub value
{
	my ($scrape, $name, %want) = @_;
	my @found = grep {
		my $l = $_->{labels};
		!grep { ($l->{$_} // '') ne $want{$_} } keys %want
	} @{ $scrape->{series}{$name} // [] };
	return undef unless @found == 1;
	return $found[0]{value};
}

sub check_common
{
	my ($s, $when) = @_;
	is(value($s, 'pg_up'), 1, "$when: pg_up 1");
	is(value($s, 'pg_exporter_last_scrape_error'), 0, "$when: no query failed");
	is(value($s, 'pg_exporter_user_queries_load_error', filename => $queries), 0,
		"$when: queries.yaml loaded");
	my @default = grep { /^pg_(settings|stat|database|locks)_/ } keys %{ $s->{series} };
	is("@default", '', "$when: default metrics are off");
	unlike($s->{text}, qr/tenant-acme|order-|short-/, "$when: no scope or key in the metrics");
}

sub check_counters
{
	my ($s, $when, %want) = @_;
	for my $c (sort keys %want)
	{
		my $name = "idempotency_${c}_total";
		is($s->{type}{$name}, 'counter', "$when: $name is a counter");
		is(value($s, $name, datname => 'app'), $want{$c}, "$when: $name");
	}
}

sub epoch { return app(q{SELECT date_part('epoch', clock_timestamp())}); }

sub between
{
	my ($got, $low, $high, $name) = @_;
	ok(defined $got && $got >= $low - 0.001 && $got <= $high + 0.001, $name)
	  or diag("got " . ($got // 'none') . ", expected [$low, $high]");
}

# ratio of the key furthest into its ttl among keys in $state, at time $t (Unix seconds)
sub ttl_ratio_at
{
	my ($state, $t) = @_;
	return app(qq{SELECT max(($t - date_part('epoch', created_at))
	                         / date_part('epoch', expires_at - created_at))
	              FROM idem_keys WHERE state = '$state'});
}

start_exporter();
my $t0 = epoch();
my $s1 = scrape();
my $t1 = epoch();

check_common($s1, 'scrape 1');
check_counters($s1, 'scrape 1', %stats);
between(value($s1, 'idempotency_last_reap_timestamp_seconds', datname => 'app'),
	$before_reap, $after_reap, 'scrape 1: last_reap_at is the idem_reap call');
between(value($s1, 'idempotency_stats_reset_timestamp_seconds', datname => 'app'),
	$before_reset1, $after_reset1, 'scrape 1: stats_reset is the first reset');
is(value($s1, 'idempotency_claims_total', datname => 'billing'), 1,
	'scrape 1: the second database counts its own claim');
is(value($s1, 'idempotency_table_keys', datname => 'billing', state => 'pending'), 1,
	'scrape 1: the second database has its own pending key');
is(value($s1, 'idempotency_expired_keys', datname => 'app'), 1,
	'scrape 1: one expired key waits for the reaper');
my %keys = (pending => 3, succeeded => 2, failed => 1);
for my $state (sort keys %keys)
{
	is(value($s1, 'idempotency_table_keys', datname => 'app', state => $state), $keys{$state},
		"scrape 1: $keys{$state} $state keys");
}
my $oldest_pending = app(q{SELECT date_part('epoch', created_at) FROM idem_keys WHERE key = 'order-3'});
between(value($s1, 'idempotency_table_oldest_key_age_seconds', datname => 'app', state => 'pending'),
	$t0 - $oldest_pending, $t1 - $oldest_pending,
	'scrape 1: the oldest pending key is order-3, an hour old');
between(value($s1, 'idempotency_table_max_ttl_used_ratio', datname => 'app', state => 'pending'),
	ttl_ratio_at('pending', $t0), ttl_ratio_at('pending', $t1),
	'scrape 1: pending keys used ~1/25 of their ttl');
is(value($s1, 'idempotency_table_max_ttl_used_ratio', datname => 'app', state => 'succeeded'),
	0, 'scrape 1: ttl ratio: pending keys only');
is(value($s1, 'idempotency_table_stalled_keys', datname => 'app', state => 'pending'),
	app('SELECT count(*) FROM idem_stalled'), 'scrape 1: stalled keys: the rows of idem_stalled (1)');
my $stalled_since = app(q{SELECT date_part('epoch', max(locked_until)) FROM idem_stalled});
between(value($s1, 'idempotency_table_oldest_stalled_seconds', datname => 'app', state => 'pending'),
	$t0 - $stalled_since, $t1 - $stalled_since,
	'scrape 1: oldest stalled: idem_stalled.stalled_for of order-5 (ten minutes)');
for my $state (qw(succeeded failed))
{
	is(value($s1, 'idempotency_table_stalled_keys', datname => 'app', state => $state), 0,
		"scrape 1: no stalled $state key");
}
for my $name (qw(idempotency_table_keys idempotency_expired_keys idempotency_last_reap_timestamp_seconds))
{
	is($s1->{type}{$name}, 'gauge', "$name is a gauge");
}

# every metric the example alerts use is exported (a renamed column would silence an alert)
my %in_alerts;
for my $line (split /\n/, slurp_file("$part/alerts.yml"))
{
	next if $line =~ /^\s*#/;
	$in_alerts{$1} = 1 while $line =~ /\b((?:idempotency|pg_exporter)_[a-z_]+)\b/g;
}
cmp_ok(scalar keys %in_alerts, '>=', 8, 'alerts.yml uses the metrics');
# (the per-scope series need the role to see scope names: checked after scrape 3 below)
for my $name (grep { !/^idempotency_scope_/ } sort keys %in_alerts)
{
	ok(exists $s1->{series}{$name}, "alerts.yml: $name is exported");
}

# ---- reset, then claims that write nothing to the table (replay, in_progress, mismatch)
my $before_reset = epoch();
app('SELECT idem_stats_reset()');
my $after_reset = epoch();
is(outcome('order-1', q{request => '{"a": 1}'}), 'replay|f', 'after the reset: order-1 replays');
is(outcome('order-4'), 'replay|f', 'after the reset: order-4 replays');
is(outcome('order-2'), 'in_progress|f', 'after the reset: order-2 in progress');
claim_mismatch('order-1', '{"a": 3}');

my $s2 = scrape();
my $t2 = epoch();
check_common($s2, 'scrape 2');
check_counters($s2, 'scrape 2',
	claims => 4, inserted => 0, replays => 2, in_progress => 1, takeovers => 0,
	mismatches => 1, completes => 0, fails => 0, reaped => 0, reaper_runs => 0);
is(value($s2, 'idempotency_last_reap_timestamp_seconds', datname => 'app'), 0,
	'scrape 2: no reap since the reset: 0');
between(value($s2, 'idempotency_stats_reset_timestamp_seconds', datname => 'app'),
	$before_reset, $after_reset, 'scrape 2: stats_reset is the reset');
# the table did not change (its query may come from the exporter's cache)
for my $state (sort keys %keys)
{
	is(value($s2, 'idempotency_table_keys', datname => 'app', state => $state), $keys{$state},
		"scrape 2: $keys{$state} $state keys");
}
between(value($s2, 'idempotency_table_oldest_key_age_seconds', datname => 'app', state => 'pending'),
	$t0 - $oldest_pending, $t2 - $oldest_pending, 'scrape 2: the oldest pending key is still order-3');
is(value($s2, 'idempotency_expired_keys', datname => 'app'), 1,
	'scrape 2: the expired key still waits');

is(scalar @{ $s2->{series}{idempotency_scope_claims_total} // [] }, 0,
	'scrape 2: no per-scope series: the role may not see scope names');

# ---- per-scope series, once the role may see scope names (exporter-role.sql -v per_scope=on)
$node->command_ok(
	[ 'psql', '-X', '-v', 'ON_ERROR_STOP=1', '-v', 'per_scope=on', '-d', $node->connstr('app'), '-f', $role_sql ],
	'exporter-role.sql -v per_scope=on');
($rc, $out, $err) = as_exporter('SELECT count(*) FROM idem_scope_stats');
# tenant-acme only: the role's own claim above was refused (25006), and per scope only answered
# claims count
is($out, 1, 'the exporter role now sees the one scope of app');
($rc, $out, $err) = as_exporter('SELECT key FROM idem_keys');
like($err, qr/42501/, 'but still no key');
# a new exporter: the cached queries of the old one ran without the grant
stop_exporter();
start_exporter();
# tenant-acme since the server started (idem_stats_reset does not reset scopes): the workload
# before the first reset and the four claims after the second
my %scope_counts = (
	claims => 18, inserted => 8, replays => 4, in_progress => 2, takeovers => 2,
	mismatches => 2, completes => 4, fails => 2, releases => 0, expired => 0);
my $work_times = q{SELECT p50_ms / 1000 || ',' || p90_ms / 1000 || ',' || p99_ms / 1000
                   FROM idem_scope_stats WHERE scope = 'tenant-acme'};
my $times_before = app($work_times);
my $t3a = epoch();
my $s3 = scrape();
my $t3b = epoch();
my $times_after = app($work_times);
is(app('SELECT ' . join(', ', sort keys %scope_counts) . q{ FROM idem_scope_stats WHERE scope = 'tenant-acme'}),
	join('|', map { $scope_counts{$_} } sort keys %scope_counts), 'idem_scope_stats counted the workload');
for my $c (sort keys %scope_counts)
{
	my $name = "idempotency_scope_${c}_total";
	is($s3->{type}{$name}, 'counter', "scrape 3: $name is a counter");
	is(value($s3, $name, datname => 'app', scope => 'tenant-acme'), $scope_counts{$c}, "scrape 3: $name");
}
is(scalar(grep { $_->{labels}{datname} eq 'app' } @{ $s3->{series}{idempotency_scope_claims_total} }), 1,
	'scrape 3: one scope in app');
is(scalar(grep { $_->{labels}{datname} eq 'billing' } @{ $s3->{series}{idempotency_scope_claims_total} }), 0,
	'scrape 3: no scope of billing, where the role was not granted per_scope');
# the windows may move on between the reads: the scrape equals the view before or after it
my $scraped = join(',', map { value($s3, "idempotency_scope_work_${_}_seconds", datname => 'app', scope => 'tenant-acme') }
	qw(p50 p90 p99));
ok($scraped eq $times_before || $scraped eq $times_after,
	"scrape 3: work p50, p90, p99 as idem_scope_stats has them ($scraped)")
  or diag("view: $times_before / $times_after");
between(value($s3, 'idempotency_scope_pending_oldest_age_seconds', datname => 'app', scope => 'tenant-acme'),
	$t3a - $oldest_pending, $t3b - $oldest_pending, 'scrape 3: the oldest pending key of tenant-acme is order-3');
for my $name (grep { /^idempotency_scope_/ } sort keys %in_alerts)
{
	ok(exists $s3->{series}{$name}, "alerts.yml: $name is exported");
}

# ---- the Grafana dashboard: every metric its PromQL names is exported (scrape 3 has every
# family: the workload, a reap, and the per-scope series)
my $dashboard = JSON::PP->new->decode(slurp_file("$part/grafana-dashboard.json"));
my @exprs = map { $_->{expr} } map { @{ $_->{targets} } } @{ $dashboard->{panels} };
push @exprs, map { $_->{definition} =~ /^label_values\((.*), \w+\)$/ ? $1 : () }
  grep { $_->{type} eq 'query' } @{ $dashboard->{templating}{list} };
cmp_ok(scalar @exprs, '>=', 20, 'the dashboard has its queries');
# Grafana's variables, as Grafana substitutes them, leave plain PromQL
my @promql = map {
	(my $e = $_) =~ s/\$__rate_interval\b/5m/g;
	$e =~ s/\$\{?\w+\}?/.*/g;
	$e
} @exprs;
my $rules_check = "$PostgreSQL::Test::Utils::tmp_check/dashboard-exprs.yml";
open(my $rules_fh, '>', $rules_check) or die $!;
print $rules_fh "groups:\n  - name: dashboard\n    rules:\n";
printf $rules_fh "      - record: dashboard:expr_%d\n        expr: %s\n", $_, JSON::PP->new->encode([ $promql[$_] ]) =~ s/^\[|\]$//gr
  for 0 .. $#promql;
close $rules_fh;
my ($promtool_out, $promtool_err) = run_command([ 'promtool', 'check', 'rules', $rules_check ]);
like($promtool_out, qr/SUCCESS: ${\ scalar @promql} rules found/, 'promtool parses every query of the dashboard')
  or diag($promtool_out, $promtool_err);
my %in_dashboard;
for my $e (@promql)
{
	$e =~ s/"(?:[^"\\]|\\.)*"//g;                                        # strings
	$e =~ s/\{[^}]*\}|\[[^\]]*\]//g;                                    # matchers, ranges
	$e =~ s/\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)//g; # label lists
	while ($e =~ /(?<![\w:.])([a-zA-Z_:][\w:]*)\b(?!\s*\()/g)
	{
		my $name = $1;
		next if $name =~ /^(?:and|or|unless|bool|offset|by|without|on|ignoring|inf|nan)$/i;
		$in_dashboard{$name} = 1;
	}
}
my @wanted = map { "idempotency_$_" } qw(inserted_total takeovers_total replays_total
  in_progress_total mismatches_total scope_mismatches_total table_keys
  scope_work_p50_seconds scope_work_p90_seconds scope_work_p99_seconds
  table_oldest_key_age_seconds scope_pending_oldest_age_seconds reaped_total reaper_runs_total
  expired_keys);
is(join(' ', grep { !$in_dashboard{$_} } @wanted), '',
	'the dashboard shows outcomes, replays, mismatches, in progress, work times, oldest pending, reaper');
for my $name (sort keys %in_dashboard)
{
	ok(exists $s3->{series}{$name}, "grafana-dashboard.json: $name is exported");
}

# ---- per-scope export taken back: exporter-role.sql -v per_scope=off after on
$node->command_ok(
	[ 'psql', '-X', '-v', 'ON_ERROR_STOP=1', '-v', 'per_scope=off', '-d', $node->connstr('app'), '-f', $role_sql ],
	'exporter-role.sql -v per_scope=off');
($rc, $out, $err) = as_exporter('SELECT count(*) FROM idem_scope_stats');
is($out, 0, 'the exporter role no longer sees a scope');
($rc, $out, $err) = as_exporter('SELECT scope FROM idem_keys');
like($err, qr/42501/, 'nor idem_keys.scope');
# the per-scope counters' query has no cache: the running exporter's next scrape drops them
my $s4 = scrape();
is(join(' ', grep { /^idempotency_scope_.*_total$/ } sort keys %{ $s4->{series} }), '',
	'scrape 4: the per-scope counters are gone');
# the oldest pending age per scope is cached for 60 s: a new exporter drops it at once
stop_exporter();
start_exporter();
my $s5 = scrape();
check_common($s5, 'scrape 5');
is(join(' ', grep { /^idempotency_scope_/ } sort keys %{ $s5->{series} }), '',
	'scrape 5 (new exporter): no per-scope series');
is(value($s5, 'idempotency_claims_total', datname => 'app'), 4, 'scrape 5: the database-wide series stay');

stop_exporter();
unlike(slurp_file($exporter_log), qr/tenant-acme|order-/, 'the exporter log names no scope or key');
$node->stop;
done_testing();
