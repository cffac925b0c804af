# Moves between the editions (docs/editions.md) by pg_dump and pg_restore: keys in every state
# written by one edition are dumped and restored under the other, and every key answers the same
# afterwards.
#
# The editions share idem_keys' layout, so the table's data moves as it is.  Here the SQL edition
# is its plain-SQL install (sql-edition/build, psql -f): the move is pg_dump --data-only of
# idem_keys (custom format) and pg_restore --data-only into a database where the other edition is
# installed.  Both ways: C -> SQL and SQL -> C.  Keys: pending with a live lease, pending past its
# lease, succeeded with a response, a byte-exact body (every byte value) and headers, failed
# retryable, failed terminal, expired and not reaped, taken over (attempt 2), claimed with an
# explicit fingerprint and with none, in two scopes.  After the move: idem_keys is identical
# column by column; every key's idem_lookup is the same in the source (its own edition) and the
# target (the other edition); then every key is claimed in both with its request, and the answers
# (outcome, inserted, attempt, state, response, code, body, headers, expires_at when stored,
# whether retry_after is set) and the rows are the same in both.
#
# The extension route, the real move: where the server has extension_control_path (PostgreSQL 18),
# the SQL edition's file-based extension (sql-edition/build's extension/ directory) is put first in
# that path for one session, so that CREATE EXTENSION idempotency installs the SQL edition there
# while the C edition is the one installed on the server.  A database of one edition is dumped
# whole (pg_dump -Fc: CREATE EXTENSION idempotency and idem_keys' data, a configuration table) and
# restored with pg_restore into a new database where CREATE EXTENSION finds the other edition;
# both ways, with the same checks.  Older servers cannot put two extensions of one name side by
# side: there the test says so and moves by the plain route only (CI runs PostgreSQL 18 too).
#
# The whole-database moves carry idem_keys' row-level security (§13) too: before the dump, its
# source confines a tenant role to one scope (the C edition's event triggers record it, the SQL
# edition's owner runs idem_row_security_record()); after the restore, the policy and the flag are
# back in the other edition and the tenant sees its scope only.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use File::Temp qw(tempdir);
use FindBin;

my $root = "$FindBin::RealBin/../..";
my $gen = tempdir(CLEANUP => 1);
ok(-f "$root/sql-edition/build", 'the SQL edition generator sql-edition/build exists')
  or do { done_testing(); exit; };    # fails, and the other test files still run
IPC::Run::run([ 'bash', "$root/sql-edition/build", $gen ], '>', \my $bout, '2>', \my $berr);
my ($plain) = glob("$gen/plain/idempotency-*.sql");
ok(defined $plain && -s $plain, 'sql-edition/build made the plain-SQL install file')
  or do { diag $berr; done_testing(); exit; };
my ($sql_version) = slurp_file("$gen/extension/idempotency.control") =~ /^default_version = '([^']+)'/m;

my $node = PostgreSQL::Test::Cluster->new('move');
$node->init(extra => [ '--encoding=UTF8', '--locale=C' ]);
$node->append_conf('postgresql.conf', "log_min_messages = warning\n");
$node->start;

sub sql { my ($db, $q) = @_; return $node->safe_psql($db, "SET TimeZone = 'UTC'; $q"); }

# the SQL edition's extension first, then the server's own extensions (PostgreSQL 18)
my $sql_path = "-c extension_control_path=$gen:\$system";

sub edition_of
{
	my ($db) = @_;
	my $lang = $node->safe_psql($db,
		q{SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE p.oid = 'idem_claim'::regproc});
	return $lang eq 'c' ? 'c' : $lang eq 'plpgsql' ? 'sql' : "unknown ($lang)";
}

sub install
{
	my ($db, $edition) = @_;
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	if ($edition eq 'c') { $node->safe_psql($db, 'CREATE EXTENSION idempotency') }
	elsif ($edition eq 'sql-ext')
	{
		local $ENV{PGOPTIONS} = $sql_path;
		$node->safe_psql($db, 'CREATE EXTENSION idempotency');
		is($node->safe_psql($db, 'SELECT idem_edition()'), 'sql', "$db: the extension is the SQL edition");
	}
	else
	{
		local $ENV{PGOPTIONS} = '-c client_min_messages=warning';
		my ($out, $err) = ('', '');
		IPC::Run::run([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr($db), '-f', $plain ],
			'>', \$out, '2>', \$err);
		die "SQL edition install into $db failed: $err" if $err ne '';
	}
	is(edition_of($db), $edition eq 'c' ? 'c' : 'sql', "$db: idem_claim is the " . ($edition eq 'c' ? 'C' : 'SQL') . " edition's");
	return;
}

# every byte value, for the byte-exact body
my $all_bytes = join('', map { sprintf('%02x', $_) } 0 .. 255);
my %request = (
	'live'     => '{"a": 1}',
	'lapsed'   => '{"a": 2.50}',
	'done'     => '{"a": 3, "b": [1, 2, {"c": null}]}',
	'retry'    => '{"a": 4}',
	'terminal' => '{"a": 5}',
	'expired'  => '{"a": 6}',
	'taken'    => '{"a": 7}',
	'nofp'     => undef,
	'fp'       => undef);

# keys in every state, written by the edition installed in $db (scopes '' and 'tenant-b')
sub fill
{
	my ($db) = @_;
	for my $scope ('', 'tenant-b')
	{
		my $s = "scope => '$scope'";
		sql($db, qq{
SELECT idem_claim('live', '$request{live}', $s, lease => '1 hour', ttl => '7 days');
SELECT idem_claim('lapsed', '$request{lapsed}', $s, lease => '1 millisecond', ttl => '7 days');
SELECT idem_claim('done', '$request{done}', $s, ttl => '7 days');
SELECT idem_complete('done', '{"ok": true, "id": 42, "n": 1.50, "text": "caf\\u00e9"}', 201, $s,
                     body => '\\x$all_bytes'::bytea, headers => '{"Location": "/x/42", "X-Multi": ["a", "b"]}');
SELECT idem_claim('retry', '$request{retry}', $s, ttl => '7 days');
SELECT idem_fail('retry', '{"error": "timeout"}', 503, retryable => true, $s);
SELECT idem_claim('terminal', '$request{terminal}', $s, ttl => '7 days');
SELECT idem_fail('terminal', '{"error": "declined"}', 422, retryable => false, $s, body => '\\x'::bytea, headers => '{}');
SELECT idem_claim('expired', '$request{expired}', $s, ttl => '7 days');
SELECT idem_complete('expired', '"old"', $s, ttl => '1 millisecond');
SELECT idem_claim('taken', '$request{taken}', $s, lease => '1 millisecond', ttl => '7 days');
SELECT pg_sleep(0.01);
SELECT idem_claim('taken', '$request{taken}', $s, lease => '1 hour');
SELECT idem_claim('nofp', $s, lease => '1 hour', ttl => '7 days');
SELECT idem_claim('fp', fingerprint => '\\xdeadbeef', $s, ttl => '7 days');
SELECT idem_complete('fp', NULL, 204, $s);
});
	}
	# the short lease and ttl above have run out
	sql($db, 'SELECT pg_sleep(0.01)');
	return;
}

my $ROWS = q{SELECT string_agg(k::text, E'\n' ORDER BY scope, key) FROM idem_keys k};

# pg_dump --data-only of idem_keys from $from, pg_restore --data-only into $to
sub move
{
	my ($from, $to) = @_;
	my $file = "$gen/$from.dump";
	$node->command_ok([ 'pg_dump', '-Fc', '--data-only', '--table=idem_keys', '-f', $file, '-d', $node->connstr($from) ],
		"pg_dump of the keys of $from");
	$node->command_ok([ 'pg_restore', '--data-only', '--exit-on-error', '-d', $node->connstr($to), $file ],
		"pg_restore of them into $to");
	return;
}

my $CLAIM_COLS = q{concat_ws('|', outcome, inserted, coalesce(attempt::text, '-'), coalesce(state::text, '-'),
                   coalesce(response::text, '-'), coalesce(response_code::text, '-'), retry_after IS NOT NULL,
                   coalesce(expires_at::text, '-'), coalesce(encode(response_body, 'hex'), '-'),
                   coalesce(response_headers::text, '-'))};

# Every key answers the same in $a (one edition) and $b (the other), moved there from $a
sub same_answers
{
	my ($a, $b, $what) = @_;
	is(sql($b, $ROWS), sql($a, $ROWS), "$what: idem_keys moved column by column");
	for my $scope ('', 'tenant-b')
	{
		for my $key (sort keys %request)
		{
			my $lookup = "SELECT coalesce(r::text, 'NULL') FROM idem_lookup('$key', scope => '$scope') r";
			is(sql($b, $lookup), sql($a, $lookup), "$what: idem_lookup('$key', scope '$scope') answers the same");
		}
	}
	# claims: the same answers; the rows they leave are the same but for the times of new writes
	for my $scope ('', 'tenant-b')
	{
		for my $key (sort keys %request)
		{
			my $args = "'$key'" . (defined $request{$key} ? ", '$request{$key}'" : '')
			  . ($key eq 'fp' ? q{, fingerprint => '\xdeadbeef'} : '') . ", scope => '$scope'";
			my $claim = "SELECT $CLAIM_COLS FROM idem_claim($args)";
			my ($ra, $rb) = (sql($a, $claim), sql($b, $claim));
			# a new write's expires_at is the clock of each edition's call: compare it only when stored
			my $fresh = $ra =~ /^claimed\|/;
			if ($fresh) { s/^((?:[^|]*\|){7})[^|]*/$1(new)/ for $ra, $rb }
			is($rb, $ra, "$what: idem_claim($args) answers the same ($ra)");
		}
	}
	my $stable = q{SELECT string_agg(concat_ws(' ', scope, key, state, attempt, encode(fingerprint, 'hex'), response,
	                 response_code, retryable, locked_until IS NULL, completed_at, encode(response_body, 'hex'),
	                 response_headers), E'\n' ORDER BY scope, key) FROM idem_keys};
	is(sql($b, $stable), sql($a, $stable), "$what: the claims left the same rows");
	return;
}

# ---- C -> SQL
install('c_src', 'c');
install('sql_dst', 'sql');
fill('c_src');
is(sql('c_src', 'SELECT count(*) FROM idem_keys'), '18', 'the C edition wrote 18 keys');
move('c_src', 'sql_dst');
same_answers('c_src', 'sql_dst', 'C -> SQL');

# ---- SQL -> C
install('sql_src', 'sql');
install('c_dst', 'c');
fill('sql_src');
is(sql('sql_src', 'SELECT count(*) FROM idem_keys'), '18', 'the SQL edition wrote 18 keys');
move('sql_src', 'c_dst');
same_answers('sql_src', 'c_dst', 'SQL -> C');

# ---- the extension route: a whole database dumped, restored where CREATE EXTENSION finds the other edition
my $major = $node->safe_psql('postgres', q{SELECT current_setting('server_version_num')::int / 10000});
if ($major >= 18)
{
	# $from's whole database, restored into a new database $to; $to_sql: CREATE EXTENSION finds the SQL edition
	my $move_whole = sub {
		my ($from, $to, $to_sql) = @_;
		my $file = "$gen/$from.whole.dump";
		$node->command_ok([ 'pg_dump', '-Fc', '-f', $file, '-d', $node->connstr($from) ], "pg_dump of the whole of $from");
		my ($list, $e) = ('', '');
		IPC::Run::run([ 'pg_restore', '-l', $file ], '>', \$list, '2>', \$e);
		like($list, qr/EXTENSION - idempotency/, "the dump of $from creates the extension");
		like($list, qr/TABLE DATA public idem_keys/, "the dump of $from holds idem_keys' data");
		local $ENV{PGOPTIONS} = $to_sql ? $sql_path : '';
		like($list, qr/TABLE DATA public idem_policies/, "the dump of $from holds the record of row-level security");
		$node->safe_psql('postgres', "CREATE DATABASE $to");
		$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr($to), $file ], "pg_restore into $to");
		return;
	};
	# the tenant role of the row-level security moved with the databases (roles are the cluster's)
	$node->safe_psql('postgres', 'CREATE ROLE tenant_b');
	my $confine = sub {
		my ($db, $record) = @_;
		$node->safe_psql($db, q{GRANT SELECT ON idem_keys TO tenant_b;
ALTER TABLE idem_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_b ON idem_keys TO tenant_b USING (scope = 'tenant-b')} . ($record ? '; SELECT idem_row_security_record()' : ''));
	};
	my $confined = sub {
		my ($db, $what) = @_;
		is($node->safe_psql($db, q{SELECT concat_ws('|', c.relrowsecurity, p.polname, p.polroles::regrole[],
		                                  pg_get_expr(p.polqual, p.polrelid))
		                             FROM pg_class c LEFT JOIN pg_policy p ON p.polrelid = c.oid
		                            WHERE c.oid = 'idem_keys'::regclass}),
			q{t|tenant_b|{tenant_b}|(scope = 'tenant-b'::text)}, "$what: idem_keys' row-level security and policy moved");
		is($node->safe_psql($db, q{SET ROLE tenant_b; SELECT count(*) || ' ' || string_agg(DISTINCT scope, ',') FROM idem_keys}),
			'9 tenant-b', "$what: the tenant role sees its scope's 9 keys only");
	};
	install('cx_src', 'c');
	fill('cx_src');
	$confine->('cx_src', 0);
	$move_whole->('cx_src', 'sqlx_dst', 1);
	$confined->('sqlx_dst', 'C -> SQL (extension)');
	is(edition_of('sqlx_dst'), 'sql', 'sqlx_dst: restored under the SQL edition');
	is($node->safe_psql('sqlx_dst', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}), $sql_version,
		"sqlx_dst: the SQL edition is the extension idempotency $sql_version");
	same_answers('cx_src', 'sqlx_dst', 'C -> SQL (extension)');

	install('sqlx_src', 'sql-ext');
	fill('sqlx_src');
	$confine->('sqlx_src', 1);
	$move_whole->('sqlx_src', 'cx_dst', 0);
	$confined->('cx_dst', 'SQL -> C (extension)');
	is(edition_of('cx_dst'), 'c', 'cx_dst: restored under the C edition');
	same_answers('sqlx_src', 'cx_dst', 'SQL -> C (extension)');
}
else
{
	note "PostgreSQL $major has no extension_control_path: the extension route (two extensions named idempotency "
	  . 'on one server) is moved on PostgreSQL 18 only; the plain route above ran';
}

$node->stop;
done_testing();
