# Without shared_preload_libraries the extension says so when it matters (docs/operations.md,
# "Without shared_preload_libraries"): a WARNING with its HINT when CREATE EXTENSION or ALTER
# EXTENSION UPDATE loads the library, and a NOTICE with the same HINT, once per session, when a
# session asks for statistics (idem_stats, idem_scope_stats) or a claim's wait has nothing to wake
# it. Preloaded, none of them.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $warning = qr/WARNING:  the idempotency library is not preloaded: no background reaper, no statistics, and a claim's wait => is not woken when the key is finished\n/;
my $notice = qr/NOTICE:  the idempotency library is not preloaded: no background reaper, no statistics, and a claim's wait => is not woken when the key is finished\n/;
my $hint = qr/HINT:  Add idempotency to shared_preload_libraries in postgresql\.conf and restart the server\./;

my $node = PostgreSQL::Test::Cluster->new('preload_messages');
$node->init;
$node->start;

# psql's stderr for one session running $sql (every statement must succeed)
sub stderr_of
{
	my ($db, $sql) = @_;
	my ($rc, $out, $err) = $node->psql($db, $sql, on_error_stop => 1);
	is($rc, 0, "runs: $sql") or diag $err;
	return $err;
}

# CREATE EXTENSION
my $err = stderr_of('postgres', 'CREATE EXTENSION idempotency');
like($err, qr/${warning}${hint}/, 'CREATE EXTENSION without preload: the WARNING, then its HINT');
is(scalar(() = $err =~ /not preloaded/g), 1, '... once');

# ALTER EXTENSION UPDATE, in a session of its own (a C function of the update script loads the library)
$node->safe_psql('postgres', 'CREATE DATABASE old');
like(stderr_of('old', q{CREATE EXTENSION idempotency VERSION '1.4'}), qr/${warning}${hint}/,
	'CREATE EXTENSION of an older version: the WARNING');
like(stderr_of('old', q{ALTER EXTENSION idempotency UPDATE TO '1.5'}), qr/${warning}${hint}/,
	'ALTER EXTENSION UPDATE without preload: the WARNING, then its HINT');

# what a session asks for, each in a new session: a NOTICE with the HINT, once per session
$err = stderr_of('postgres', 'SELECT * FROM idem_stats; SELECT * FROM idem_stats; SELECT * FROM idem_scope_stats');
like($err, qr/${notice}${hint}/, 'idem_stats without preload: a NOTICE with the HINT');
is(scalar(() = $err =~ /not preloaded/g), 1, '... once in the session, whatever follows');
like(stderr_of('postgres', 'SELECT * FROM idem_scope_stats'), qr/${notice}${hint}/,
	'idem_scope_stats without preload: the NOTICE');

$node->safe_psql('postgres', q{SELECT idem_claim('busy', lease => '1 hour')});
is(stderr_of('postgres', q{SELECT idem_claim('busy'); SELECT idem_claim('free'); SELECT idem_lookup('busy')}), '',
	'claims without wait and lookups: no message');
$err = stderr_of('postgres', q{SELECT idem_claim('busy', wait => '1 ms'); SELECT idem_claim('busy', wait => '1 ms')});
like($err, qr/${notice}${hint}/, 'a claim waiting on a lease without preload: the NOTICE');
is(scalar(() = $err =~ /not preloaded/g), 1, '... once in the session');
is(stderr_of('postgres', q{SELECT idem_claim('other', wait => '1 s')}), '',
	'a wait that finds the key free waits for nothing: no message');

# the session that created the extension was told already
is(stderr_of('postgres', 'DROP EXTENSION idempotency'), '', '(dropped)');
$err = stderr_of('postgres', 'CREATE EXTENSION idempotency; SELECT * FROM idem_stats');
is(scalar(() = $err =~ /not preloaded/g), 1, 'CREATE EXTENSION then idem_stats in one session: the WARNING only');

# preloaded: nothing said
$node->append_conf('postgresql.conf', q{shared_preload_libraries = 'idempotency'});
$node->restart;
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
is(stderr_of('fresh', 'CREATE EXTENSION idempotency'), '', 'preloaded: CREATE EXTENSION says nothing');
is(stderr_of('old', q{DROP EXTENSION idempotency; CREATE EXTENSION idempotency VERSION '1.4'}), '', '(1.4, preloaded)');
is(stderr_of('old', q{ALTER EXTENSION idempotency UPDATE TO '1.5'}), '', 'preloaded: ALTER EXTENSION UPDATE says nothing');
$node->safe_psql('fresh', q{SELECT idem_claim('busy', lease => '1 hour')});
is( stderr_of('fresh', q{SELECT * FROM idem_stats; SELECT * FROM idem_scope_stats; SELECT idem_claim('busy', wait => '1 ms')}),
	'', 'preloaded: statistics and a claim that waits say nothing');

$node->stop;
done_testing();
