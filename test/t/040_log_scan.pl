# No request or response body in the server log (issue 5, docs/contract.md §4 "no error message or log line
# contains a request or a response body").
#
# Every call below carries a distinctive body, "SECRET-BODY-<random>-<case>", in its request or
# response; after each phase the server log written during it is scanned for the marker.
#
# A. Server defaults (log_statement = none, log_min_messages = warning, log_min_error_statement =
#    error, log_parameter_max_length_on_error = 0), bodies as SQL literals, the way psql sends
#    them: every function, every success path and every error the extension raises itself (IK001
#    .. IK004, 22004, 22023, 22003, 40001): no marker, neither in the log nor in the error the
#    client gets.  Errors that PostgreSQL raises on the same calls (42501, 25006, 55P03, 57014,
#    22P02) print the statement after them (log_min_error_statement): with literal bodies the
#    body IS in the log.  That is PostgreSQL's behaviour, documented in docs/guarantees.md.
# B. The same PostgreSQL errors with the bodies as bind parameters (pgbench -M extended, as a
#    driver sends them): the logged statement holds only $1, no marker.  Exception: a body that
#    is not valid JSON, whose parser error quotes the text around the bad token in CONTEXT.
# C. log_parameter_max_length_on_error = -1 (not the default): the bound values are printed
#    after every error, the extension's own included (CONTEXT "... with parameters: $1 = ...").
# D. log_statement = all: bound values are printed with every statement (DETAIL "parameters:
#    $1 = ...") unless log_parameter_max_length = 0; then no marker.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my $node = PostgreSQL::Test::Cluster->new('log_scan');
$node->init;
# PostgreSQL::Test::Cluster sets log_statement = all; put the server defaults back, explicitly.
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_enabled = off
log_statement = none
log_min_messages = warning
log_min_error_statement = error
log_min_duration_statement = -1
log_parameter_max_length = -1
log_parameter_max_length_on_error = 0
log_error_verbosity = default
});
$node->start;

my $M = 'SECRET-BODY-' . join('', map { sprintf '%02x', int(rand(256)) } 1 .. 8);
note "marker: $M";

sub sql { return $node->safe_psql('postgres', $_[0]); }
sql(q{CREATE EXTENSION idempotency});
sql(q{CREATE ROLE app LOGIN});
sql(q{GRANT SELECT, INSERT, UPDATE, DELETE ON idem_keys TO app});
sql(q{CREATE ROLE nobody LOGIN});    # no privilege on idem_keys

my $offset = -s $node->logfile;
sub new_log
{
	my $text = slurp_file($node->logfile, $offset);
	$offset = -s $node->logfile;
	return $text;
}
sub marker_lines
{
	my ($log, $tag) = @_;
	return scalar grep { index($_, "$M-$tag") >= 0 } split /\n/, $log;
}

# psql (simple protocol, literal bodies); returns the error text the client got
sub psql_err
{
	my ($sql, %opts) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', $sql, %opts);
	return $err;
}

# ---------------------------------------------------------------------------------------------
# A. defaults, literal bodies
# ---------------------------------------------------------------------------------------------
# every success path
sql(qq{
	SELECT * FROM idem_claim('ok-1', request => '{"card": "$M-ok-claim"}');
	SELECT * FROM idem_claim('ok-1', request => '{"card": "$M-ok-claim"}');
	SELECT * FROM idem_complete('ok-1', '{"receipt": "$M-ok-complete"}', 201);
	SELECT * FROM idem_claim('ok-1', request => '{"card": "$M-ok-claim"}');
	SELECT * FROM idem_lookup('ok-1');
	SELECT * FROM idem_claim('ok-2', request => '{"card": "$M-ok-claim2"}', lease => '1 ms');
	SELECT * FROM idem_fail('ok-2', '{"error": "$M-ok-fail"}', 502, retryable => true, attempt => 1);
	SELECT * FROM idem_claim('ok-2', request => '{"card": "$M-ok-claim2"}');
	SELECT * FROM idem_fail('ok-2', '{"error": "$M-ok-fail2"}', 400, retryable => false, ttl => '1 ms');
	SELECT pg_sleep(0.01);
	SELECT idem_reap(1000);
	SELECT * FROM idem_stats;
});
sql(q{CALL idem_reap_all()});

# the extension's own errors
sql(qq{SELECT idem_claim('k-done', '{"card": "$M-setup"}')});
sql(qq{SELECT idem_complete('k-done', '{"receipt": "$M-setup"}')});
sql(qq{SELECT idem_claim('k-pending', '{"card": "$M-setup"}', lease => '1 hour')});
sql(q{SELECT idem_claim('k-max', fingerprint => '\x01')});
sql(q{UPDATE idem_keys SET attempt = 2147483647 WHERE key = 'k-max'});
sql(q{SELECT idem_fail('k-max')});
my %own = (
	IK001      => qq{SELECT idem_claim('k-done', '{"card": "$M-IK001"}')},
	IK002      => qq{SELECT idem_complete('k-pending', '{"receipt": "$M-IK002"}', attempt => 7)},
	IK003      => qq{SELECT idem_complete('k-missing', '{"receipt": "$M-IK003"}')},
	IK004      => qq{SELECT idem_complete('k-done', '{"receipt": "$M-IK004"}')},
	IK004_fail => qq{SELECT idem_fail('k-done', '{"error": "$M-IK004_fail"}', 500)},
	'22004'    => qq{SELECT idem_complete('k-pending', '{"receipt": "$M-22004"}', NULL)},
	'22023_key' => qq{SELECT idem_claim(E'bad\\tkey', '{"card": "$M-22023_key"}')},
	'22023_ttl' => qq{SELECT idem_claim('k-new', '{"card": "$M-22023_ttl"}', ttl => '0')},
	'22023_fingerprint' =>
	  qq{SELECT idem_claim('k-new', '{"card": "$M-22023_fingerprint"}', fingerprint => '\\x')},
	'22023_scope' => qq{SELECT idem_claim('k-new', '{"card": "$M-22023_scope"}', repeat('s', 256))},
	# (the given fingerprint is the one compared; the request is only in the statement's text)
	'22003'    => qq{SELECT idem_claim('k-max', '{"card": "$M-22003"}', fingerprint => '\\x01')},
);
my %own_code = (IK001 => 'IK001', IK002 => 'IK002', IK003 => 'IK003', IK004 => 'IK004',
	IK004_fail => 'IK004', '22004' => '22004', '22023_key' => '22023', '22023_ttl' => '22023',
	'22023_fingerprint' => '22023', '22023_scope' => '22023', '22003' => '22003');
my %client_err;
for my $tag (sort keys %own)
{
	$client_err{$tag} = psql_err("\\set VERBOSITY verbose\n$own{$tag}");
}
# 40001: a repeatable-read snapshot that cannot see the committed key
my $rr = $node->background_psql('postgres', on_error_stop => 0);
$rr->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$rr->query_safe('SELECT 1');
sql(q{SELECT idem_claim('k-rr')});
$rr->query("\\set VERBOSITY verbose\nSELECT idem_claim('k-rr', '{\"card\": \"$M-40001\"}')");
$client_err{'40001'} = $rr->{stderr};
$own_code{'40001'} = '40001';
$rr->query('ROLLBACK');
$rr->quit;

my $log = new_log();
for my $tag (sort keys %own_code)
{
	like($client_err{$tag}, qr/ERROR:  $own_code{$tag}:/, "A. $tag: the client got $own_code{$tag}");
	unlike($client_err{$tag}, qr/\Q$M\E/, "A. $tag: the client's error names no body");
	is(marker_lines($log, $tag), 0, "A. $tag: no body in the server log");
}
is(marker_lines($log, 'ok'), 0, 'A. success paths: no body in the server log');
is(marker_lines($log, 'setup'), 0, 'A. setup statements: no body in the server log');
is(scalar(() = $log =~ /\Q$M\E/g), 0, 'A. the marker appears nowhere in the log of phase A')
  or diag $log;
like($log, qr/ERROR:  idempotency key "k-done" was already used with a different request/,
	'A. (the errors themselves are logged, without the statement)');

# errors PostgreSQL raises itself: the statement follows them in the log, bodies included
my %pg = (
	'42501' => sub { psql_err(qq{SELECT idem_claim('p-1', '{"card": "$M-p42501"}')},
			extra_params => [ '-U', 'nobody' ]) },
	'25006' => sub { psql_err(qq{BEGIN READ ONLY; SELECT idem_claim('p-2', '{"card": "$M-p25006"}')}) },
	'22P02' => sub { psql_err(qq<SELECT idem_claim('p-3', '{"card": "$M-p22P02"')>) },
);
# 55P03 / 57014: complete of a key whose row another session holds locked
my $locker = $node->background_psql('postgres');
$locker->query_safe('BEGIN');
$locker->query_safe(q{SELECT 1 FROM idem_keys WHERE key = 'k-pending' FOR UPDATE});
$pg{'55P03'} = sub { psql_err(qq{SET lock_timeout = '100ms';
	SELECT idem_complete('k-pending', '{"receipt": "$M-p55P03"}')}) };
$pg{'57014'} = sub { psql_err(qq{SET statement_timeout = '100ms';
	SELECT idem_complete('k-pending', '{"receipt": "$M-p57014"}')}) };
my %pg_err;
$pg_err{$_} = $pg{$_}->() for sort keys %pg;
$log = new_log();
for my $code (sort keys %pg)
{
	like($pg_err{$code}, qr/ERROR:  /, "A. literal body: $code raised") or diag $pg_err{$code};
	ok(marker_lines($log, "p$code") > 0,
		"A. literal body: after $code (raised by PostgreSQL) the logged statement holds the body");
}
like($log, qr/STATEMENT:  .*\Q$M\E-p42501/, 'A. ... in the STATEMENT line (log_min_error_statement)');

# ---------------------------------------------------------------------------------------------
# B. the same, bodies as bind parameters (extended protocol, as drivers send them)
# ---------------------------------------------------------------------------------------------
my $tmp = PostgreSQL::Test::Utils::tempdir;
# pgbench(tag, sql, user, PGOPTIONS): runs sql once with :body bound to a marked body; returns
# pgbench's stderr (the error the client got)
sub pgbench
{
	my ($tag, $sql, $user, $options) = @_;
	my $file = "$tmp/$tag.sql";
	open my $fh, '>', $file or die;
	print $fh "$sql\n";
	close $fh;
	local $ENV{PGOPTIONS} = $options // '';
	my ($out, $err);
	IPC::Run::run([ $node->installed_command('pgbench'), '-n', '-M', 'extended', '-t', '1',
		'-h', $node->host, '-p', $node->port, '-U', ($user // 'app'),
		'-D', qq{body={"card": "$M-$tag"}}, '-f', $file, 'postgres' ], '>', \$out, '2>', \$err);
	return $err;
}

my %bind = (
	b42501 => [ q{SELECT idem_claim('b-1', :body::jsonb)}, 'nobody' ],
	b25006 => [ q{SELECT idem_claim('b-2', :body::jsonb)}, 'app', '-c default_transaction_read_only=on' ],
	b55P03 => [ q{SELECT idem_complete('k-pending', :body::jsonb)}, 'app', '-c lock_timeout=100' ],
	b57014 => [ q{SELECT idem_complete('k-pending', :body::jsonb)}, 'app', '-c statement_timeout=100' ],
	bIK001 => [ q{SELECT idem_claim('k-done', :body::jsonb)}, 'app' ],
	bIK004 => [ q{SELECT idem_complete('k-done', :body::jsonb)}, 'app' ],
	b22023 => [ q{SELECT idem_claim('', :body::jsonb)}, 'app' ],
	bok    => [ q{SELECT idem_claim('b-ok', :body::jsonb)}, 'app' ],
);
my %bind_msg = (
	b42501 => qr/ERROR:  permission denied for table idem_keys/,
	b25006 => qr/ERROR:  cannot execute idem_claim\(\) in a read-only transaction/,
	b55P03 => qr/ERROR:  canceling statement due to lock timeout/,
	b57014 => qr/ERROR:  canceling statement due to statement timeout/,
	bIK001 => qr/ERROR:  idempotency key "k-done" was already used with a different request/,
	bIK004 => qr/ERROR:  idempotency key "k-done" is not pending/,
	b22023 => qr/ERROR:  argument "key" must be 1 to 255 characters long/,
);
my %bind_err;
$bind_err{$_} = pgbench($_, @{ $bind{$_} }) for sort keys %bind;
# a body that is not JSON: its parser's error quotes it
{
	my $file = "$tmp/bjson2.sql";
	open my $fh, '>', $file or die;
	print $fh q{SELECT idem_claim('b-4', :body::jsonb)} . "\n";
	close $fh;
	my ($out, $err);
	IPC::Run::run([ $node->installed_command('pgbench'), '-n', '-M', 'extended', '-t', '1',
		'-h', $node->host, '-p', $node->port, '-U', 'app',
		'-D', qq{body={"card": "$M-bjson2"}, oops}, '-f', $file, 'postgres' ], '>', \$out, '2>', \$err);
	$bind_err{bjson2} = $err;
}
$log = new_log();
for my $tag (sort keys %bind)
{
	next if $tag eq 'bok';
	my $code = substr($tag, 1);
	like($bind_err{$tag}, $bind_msg{$tag}, "B. bind parameter: $code raised") or diag $bind_err{$tag};
	is(marker_lines($log, $tag), 0, "B. bind parameter: no body in the log after $code");
}
like($log, qr/STATEMENT:  SELECT idem_claim\('b-1', \$1::jsonb\)/,
	'B. the statement is logged with the placeholder $1 only');
is(marker_lines($log, 'bok'), 0, 'B. success: nothing logged');
like($bind_err{bjson2}, qr/invalid input syntax for type json/, 'B. a body that is not JSON: 22P02');
ok(marker_lines($log, 'bjson2') > 0,
	'B. ... and its parser error quotes the body (CONTEXT "JSON data, line 1: ...") even when bound');

# ---------------------------------------------------------------------------------------------
# C. log_parameter_max_length_on_error = -1: bound values follow every error, the extension's too
# ---------------------------------------------------------------------------------------------
$node->append_conf('postgresql.conf', 'log_parameter_max_length_on_error = -1');
$node->reload;
$node->poll_query_until('postgres', q{SELECT current_setting('log_parameter_max_length_on_error') = '-1'})
  or die 'reload';
new_log();
pgbench('cIK001', q{SELECT idem_claim('k-done', :body::jsonb)}, 'app');
pgbench('c42501', q{SELECT idem_claim('c-1', :body::jsonb)}, 'nobody');
pgbench('cok', q{SELECT idem_claim('c-ok', :body::jsonb)}, 'app');
$log = new_log();
ok(marker_lines($log, 'cIK001') > 0,
	'C. log_parameter_max_length_on_error = -1: the bound body follows the extension\'s own IK001');
like($log, qr/CONTEXT:  .*parameters: \$1 = '\{"card": "\Q$M\E-cIK001"\}'/, 'C. ... in CONTEXT');
ok(marker_lines($log, 'c42501') > 0, 'C. ... and PostgreSQL\'s 42501');
is(marker_lines($log, 'cok'), 0, 'C. success: nothing logged');
$node->append_conf('postgresql.conf', 'log_parameter_max_length_on_error = 0');

# ---------------------------------------------------------------------------------------------
# D. log_statement = all: bound values are logged unless log_parameter_max_length = 0
# ---------------------------------------------------------------------------------------------
$node->append_conf('postgresql.conf', 'log_statement = all');
$node->reload;
$node->poll_query_until('postgres', q{SELECT current_setting('log_statement') = 'all'
	AND current_setting('log_parameter_max_length_on_error') = '0'}) or die 'reload';
new_log();
pgbench('dall', q{SELECT idem_claim('d-1', :body::jsonb)}, 'app');
$log = new_log();
# "parameters:" until 16, "Parameters:" from 17
like($log, qr/DETAIL:  [Pp]arameters: \$1 = '\{"card": "\Q$M\E-dall"\}'/,
	'D. log_statement = all: bound bodies are logged (DETAIL parameters)');
$node->append_conf('postgresql.conf', 'log_parameter_max_length = 0');
$node->reload;
$node->poll_query_until('postgres', q{SELECT current_setting('log_parameter_max_length') = '0'})
  or die 'reload';
new_log();
pgbench('dnone', q{SELECT idem_claim('d-2', :body::jsonb)}, 'app');
pgbench('dIK001', q{SELECT idem_claim('k-done', :body::jsonb)}, 'app');
$log = new_log();
like($log, qr/execute <unnamed>: SELECT idem_claim\('d-2', \$1::jsonb\)/,
	'D. log_statement = all, log_parameter_max_length = 0: the statement is logged...');
is(marker_lines($log, 'dnone'), 0, 'D. ... without the bound body');
is(marker_lines($log, 'dIK001'), 0, 'D. ... and without it after an error too');

$locker->query_safe('ROLLBACK');
$locker->quit;
$node->stop;
done_testing();
