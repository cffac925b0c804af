# README.md's setup, run as written: its `sh setup` blocks, in order, in one bash (set -euo
# pipefail), from the top of a checkout laid out as scripts/run lays it out (.pgdata, .run with the
# socket and the port, scripts/ and monitoring/ of this tree) whose cluster is set up as
# scripts/run sets it up (127.0.0.1 with scram-sha-256, a private socket with trust, the library
# preloaded, the demo database with the extension). Then the scrapes the blocks made are checked.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use File::Basename qw(dirname);
use File::Spec;
use File::Temp qw(tempdir);
use IPC::Run qw(run);

my $part = File::Spec->rel2abs(dirname(__FILE__) . '/..');
my $tree = File::Spec->rel2abs("$part/../..");

my @blocks = slurp_file("$part/README.md") =~ /^```sh setup\n(.*?)^```\n/msg;
cmp_ok(scalar @blocks, '>=', 5, 'README.md has its setup blocks');
my ($on_block) = grep { $blocks[$_] =~ /per_scope=on/ } 0 .. $#blocks;
my ($off_block) = grep { $blocks[$_] =~ /per_scope=off/ } 0 .. $#blocks;
my ($scrape_block) = grep { $blocks[$_] =~ m{/metrics} } 0 .. $#blocks;
ok(defined $on_block && defined $scrape_block && defined $off_block && $on_block < $scrape_block
	  && $scrape_block < $off_block, 'per-scope export on, a scrape, per-scope export off');
unlike(join('', @blocks), qr/DATA_SOURCE_NAME=[^\n]*password/, 'no password in the DSN');

# the checkout: short, for the socket path (scripts/run refuses over 90 characters)
my $root = tempdir('/tmp/idem-readme-XXXXXX', CLEANUP => 1);
symlink("$tree/$_", "$root/$_") or die "symlink $_: $!" for qw(scripts monitoring);
my $cluster = "$tree/scripts/cluster";
sub free_port
{
	my $port = `bash $cluster port --holder $$`;
	$? == 0 && $port =~ /^(\d+)$/ or BAIL_OUT('scripts/cluster port failed');
	return $1;
}
my $port = free_port();
my $exporter_port = free_port();
my $server_log = "$PostgreSQL::Test::Utils::log_path/readme-cluster.log";

# scripts/run's cluster, made as scripts/run makes it
mkdir("$root/.run", 0700) or die $!;
system_or_bail('bash', $cluster, 'init', "$root/.pgdata", '--socket', "$root/.run", '--port', $port,
	'--tcp', '--preload', '--auth-host', 'scram-sha-256');
append_to_file("$root/.run/port", "$port\n");
system_or_bail('bash', $cluster, 'start', "$root/.pgdata", '--log', $server_log);
END
{
	# the README's last block stops the exporter; after a failure before it, stop it here
	if ($root && open(my $fh, '<', "$root/.run/exporter.pid"))
	{
		my $pid = <$fh>;
		kill 'TERM', $1 if defined $pid && $pid =~ /^(\d+)/;
	}
	system('bash', $cluster, 'stop', "$root/.pgdata", '--mode', 'immediate') if $root && -d "$root/.pgdata";
}
$SIG{INT} = $SIG{TERM} = sub { exit 1; };

sub superuser_psql
{
	my ($db, $sql) = @_;
	my $out;
	run([ 'psql', '-X', '-q', '-At', '-v', 'ON_ERROR_STOP=1', '-h', "$root/.run", '-p', $port,
		'-d', $db, '-c', $sql ], '>', \$out) or BAIL_OUT("psql: $sql");
	chomp $out;
	return $out;
}
# the demo database as scripts/run leaves it: the extension, and claims in two scopes
superuser_psql('postgres', 'CREATE DATABASE idempotency_demo');
superuser_psql('idempotency_demo', 'CREATE EXTENSION idempotency');
is(superuser_psql('idempotency_demo', qq{SELECT outcome FROM idem_claim('req-1', scope => '$_')}), 'claimed',
	"req-1 claimed in $_") for 'tenant-a:POST /orders', 'tenant-b:POST /orders';
is(superuser_psql('idempotency_demo', q{SELECT outcome FROM idem_claim('req-1', scope => 'tenant-b:POST /orders')}),
	'in_progress', 'req-1 in progress in tenant-b');
my $scope_b_claims = superuser_psql('idempotency_demo',
	q{SELECT claims FROM idem_scope_stats WHERE scope = 'tenant-b:POST /orders'});
is($scope_b_claims, 2, 'idem_scope_stats: two claims in tenant-b');

# the blocks, literally; between them a marker (which block failed) and, after the two blocks
# whose effect is checked below, a scrape kept in a file
my $script = "set -euo pipefail\n";
for my $i (0 .. $#blocks)
{
	$script .= "echo '--- README setup block " . ($i + 1) . "' >&2\n$blocks[$i]";
	$script .= qq{curl -sS "http://\$EXPORTER_LISTEN/metrics" >"$root/scrape-$i.txt"\n}
	  if $i == $scrape_block || $i == $off_block;
}
my ($out, $err) = ('', '');
{
	local %ENV = %ENV;
	delete @ENV{qw(PGHOST PGHOSTADDR PGPORT PGUSER PGDATABASE PGPASSWORD PGPASSFILE PGSERVICE PGOPTIONS)};
	$ENV{EXPORTER_LISTEN} = "127.0.0.1:$exporter_port";
	my $ok = run([ 'bash', '-c', $script ], '<', \undef, '>', \$out, '2>', \$err,
		init => sub { chdir $root or die "chdir $root: $!" });
	ok($ok, "the README's setup blocks run as written") or diag("stdout:\n$out\nstderr:\n$err");
}
note("the scrape block printed:\n$out");

# libpq's password file: mode 0600, and the role logs in over TCP with it and not without it
my $pgpass = "$root/.run/exporter.pgpass";
is(sprintf('%04o', (stat $pgpass)[2] & 07777), '0600', 'the password file is readable by its owner only');
my ($password) = slurp_file($pgpass) =~ /:([^:\n]+)\n\z/;
sub exporter_login
{
	my (%env) = @_;
	local %ENV = (%ENV, %env);
	delete $ENV{PGPASSWORD};
	my ($stdout, $stderr);
	my $ok = run([ 'psql', '-X', '-At', '-w', '-c', 'SELECT current_user',
		"host=127.0.0.1 port=$port dbname=idempotency_demo user=idempotency_exporter sslmode=disable" ],
		'>', \$stdout, '2>', \$stderr);
	return ($ok, ($stdout // '') . ($stderr // ''));
}
my ($login_ok, $login_out) = exporter_login(PGPASSFILE => $pgpass);
ok($login_ok && $login_out =~ /^idempotency_exporter$/m, 'idempotency_exporter logs in over TCP with the password file')
  or diag($login_out);
($login_ok, $login_out) = exporter_login(PGPASSFILE => '/dev/null');
ok(!$login_ok && $login_out =~ /password/, 'and not without it') or diag($login_out);

# the scrape with per-scope export on: the README's grep printed these, values of the workload
my $server = qq{server="127.0.0.1:$port"};
like($out, qr/^idempotency_claims_total\{datname="idempotency_demo",$server\} 3$/m,
	'scrape: the three claims of idempotency_demo');
like($out, qr/^idempotency_table_keys\{datname="idempotency_demo",$server,state="pending"\} 2$/m,
	'scrape: two pending keys');
like($out, qr{^idempotency_scope_claims_total\{datname="idempotency_demo",scope="tenant-b:POST /orders",$server\} 2$}m,
	'scrape: per scope (-v per_scope=on), two claims of tenant-b');
my $on = -f "$root/scrape-$scrape_block.txt" ? slurp_file("$root/scrape-$scrape_block.txt") : '';
like($on, qr/^idempotency_scope_work_p99_seconds\{/m, 'scrape: the per-scope work times');

# after -v per_scope=off on the running exporter: the per-scope counters are gone
my $off = -f "$root/scrape-$off_block.txt" ? slurp_file("$root/scrape-$off_block.txt") : '';
like($off, qr/^idempotency_claims_total\{datname="idempotency_demo",$server\} 3$/m,
	'after per_scope=off: the database-wide series stay');
unlike($off, qr/^idempotency_scope_\w+_total\{/m, 'after per_scope=off: no per-scope counter');

my $exporter_log = -f "$root/.run/exporter.log" ? slurp_file("$root/.run/exporter.log") : '';
ok($exporter_log ne '', 'the exporter wrote its log to .run/exporter.log');
unlike($exporter_log, qr/\Q$password\E/, 'the exporter log holds no password') if defined $password;

done_testing();
