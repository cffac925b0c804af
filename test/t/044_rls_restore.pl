# Tenant isolation that survives a restore (1.5; docs/security.md "Row-level security across
# dumps and restores").
#
# A database with two tenants isolated by the documented policies on idem_keys (a setting-bound
# policy and a restrictive role-bound one) is dumped and restored: pg_dump custom format with
# pg_restore, plain format with psql, and pg_dumpall into a second cluster. After each, with no
# manual step, idem_keys has row-level security and both policies, and each tenant sees and
# touches only its own keys. Where a restore cannot put them back (a data-only restore with
# triggers disabled; a policy naming a role the new cluster lacks), the roles they would confine
# are refused with IK006 until idem_row_security_apply() runs, and never see another tenant's keys.
# The record follows the DDL that changes it (ALTER/DROP POLICY, DISABLE/FORCE), ignores DDL that
# does not, 1.4 -> 1.5 takes over policies made by hand under 1.4, and 1.5 -> 1.6 carries the record
# over, in force or not.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use IdemSqlstate;

my $node = PostgreSQL::Test::Cluster->new('src');
$node->init(extra => [ '--encoding=UTF8', '--locale=C' ]);
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_enabled = off
});
$node->start;
my $tmp = PostgreSQL::Test::Utils::tempdir;

sub sql { my ($n, $db, $q) = @_; return $n->safe_psql($db, $q); }

# (stdout, stderr) of $q run as role $role with app.tenant = $tenant
sub as_role
{
	my ($n, $db, $role, $tenant, $q) = @_;
	my ($rc, $out, $err) = $n->psql($db, "SET app.tenant = '$tenant';\n\\set VERBOSITY sqlstate\n$q",
		extra_params => [ '-U', $role ]);
	return ($out, $err);
}
sub sqlstate_as
{
	my ($out, $err) = as_role(@_);
	return $err =~ /ERROR:\s+(\S{5})/ ? $1 : "no error: $out$err";
}

my $roles = q{
	CREATE ROLE tenant_a LOGIN;
	CREATE ROLE tenant_b LOGIN;
};
my $setup = q{
	CREATE SCHEMA idem;
	CREATE EXTENSION idempotency SCHEMA idem;
	GRANT USAGE ON SCHEMA idem TO tenant_a, tenant_b;
	GRANT SELECT, INSERT, UPDATE, DELETE ON idem.idem_keys TO tenant_a, tenant_b;
};
my $policies = q{
	ALTER TABLE idem.idem_keys ENABLE ROW LEVEL SECURITY;
	CREATE POLICY tenant ON idem.idem_keys
		USING (scope = current_setting('app.tenant'))
		WITH CHECK (scope = current_setting('app.tenant'));
	CREATE POLICY tenant_role ON idem.idem_keys AS RESTRICTIVE TO tenant_a, tenant_b
		USING (scope = current_user) WITH CHECK (scope = current_user);
};
sql($node, 'postgres', $roles);
sql($node, 'postgres', 'CREATE DATABASE src');
sql($node, 'src', $setup . $policies);
for my $t (qw(a b))
{
	my ($out, $err) = as_role($node, 'src', "tenant_$t", "tenant_$t", qq{
		SELECT outcome FROM idem.idem_claim('k-$t', '{"n": 1}', scope => 'tenant_$t', ttl => '7 days');
		SELECT state FROM idem.idem_complete('k-$t', '{"owner": "$t"}', 201, scope => 'tenant_$t');
		SELECT outcome FROM idem.idem_claim('shared-key', scope => 'tenant_$t', ttl => '7 days');});
	is($err, '', "tenant $t stores its keys in the source");
}
is(sql($node, 'src', q{SELECT enabled::text || forced::text FROM idem.idem_row_security}), 'truefalse',
	'ENABLE ROW LEVEL SECURITY is recorded');
is(sql($node, 'src', q{SELECT string_agg(name || ' ' || permissive || ' ' || array_to_string(roles, ','), '; ' ORDER BY name) FROM idem.idem_policies}),
	'tenant true public; tenant_role false tenant_a,tenant_b', 'both policies are recorded');

# Isolation as each tenant sees it: own keys only, the other's key absent or refused.
sub check_isolated
{
	my ($n, $db, $label) = @_;
	is(sql($n, $db, q{SELECT relrowsecurity::text || ' ' || (SELECT string_agg(polname, ',' ORDER BY polname) FROM pg_policy WHERE polrelid = 'idem.idem_keys'::regclass)
		FROM pg_class WHERE oid = 'idem.idem_keys'::regclass}),
		'true tenant,tenant_role', "$label: row-level security and both policies are back");
	is(sql($n, $db, 'SELECT count(*) FROM idem.idem_keys'), '4', "$label: every key restored");
	for my $t (qw(a b))
	{
		my $o = $t eq 'a' ? 'b' : 'a';
		my ($out, $err) = as_role($n, $db, "tenant_$t", "tenant_$t", qq{
			SELECT string_agg(scope || '/' || key, ',' ORDER BY key) FROM idem.idem_keys;
			SELECT outcome || ' ' || response_code || ' ' || response::text FROM idem.idem_claim('k-$t', '{"n": 1}', scope => 'tenant_$t');
			SELECT (k).key IS NULL FROM (SELECT idem.idem_lookup('k-$o', scope => 'tenant_$o') AS k) s;});
		is($err, '', "$label: tenant $t works");
		is($out, "tenant_$t/k-$t,tenant_$t/shared-key\nreplay 201 {\"owner\": \"$t\"}\nt",
			"$label: tenant $t sees its own keys only, replays its own, does not see the other's");
		is(sqlstate_as($n, $db, "tenant_$t", "tenant_$t", qq{SELECT idem.idem_claim('k-$o', '{"n": 1}', scope => 'tenant_$o')}),
			'42501', "$label: tenant $t cannot claim the other's key");
		is(sqlstate_as($n, $db, "tenant_$t", "tenant_$o", qq{SELECT idem.idem_claim('k-$o', '{"n": 1}', scope => 'tenant_$o')}),
			'42501', "$label: tenant $t cannot reach the other's key by setting app.tenant (role-bound policy)");
	}
}

# ---- pg_dump custom and plain formats, restored into new databases of the same cluster
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$tmp/src.dump", '-d', $node->connstr('src') ], 'pg_dump -Fc');
$node->command_ok([ 'pg_dump', '-Fp', '-f', "$tmp/src.sql", '-d', $node->connstr('src') ], 'pg_dump -Fp');
sql($node, 'postgres', 'CREATE DATABASE dst_custom');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('dst_custom'), "$tmp/src.dump" ],
	'pg_restore into a new database');
check_isolated($node, 'dst_custom', 'pg_restore of a custom dump');
sql($node, 'postgres', 'CREATE DATABASE dst_plain');
$node->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('dst_plain'),
	'-f', "$tmp/src.sql" ], 'plain dump restored with psql');
check_isolated($node, 'dst_plain', 'psql of a plain dump');

# ---- pg_dumpall into a new cluster
$node->command_ok([ 'pg_dumpall', '-f', "$tmp/all.sql", '-d', $node->connstr('postgres') ], 'pg_dumpall');
my $other = PostgreSQL::Test::Cluster->new('dst');
$other->init(extra => [ '--encoding=UTF8', '--locale=C' ]);
$other->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_enabled = off
});
$other->start;
# pg_dumpall re-creates the bootstrap superuser, which the new cluster has already
my ($rc, $out, $err);
$other->run_log([ 'psql', '-X', '-q', '-d', $other->connstr('postgres'), '-f', "$tmp/all.sql" ], '2>', \$err);
unlike($err, qr/ERROR:(?!  role "\w+" already exists)/, 'pg_dumpall restored into a new cluster');
check_isolated($other, 'src', 'pg_dumpall into a new cluster');

# ---- a data-only restore with triggers disabled cannot apply the record: confined roles refused
sql($node, 'postgres', 'CREATE DATABASE dst_data');
sql($node, 'dst_data', $setup);
$node->command_ok([ 'pg_restore', '--data-only', '--disable-triggers', '--exit-on-error',
	'-d', $node->connstr('dst_data'), "$tmp/src.dump" ], 'data-only restore with --disable-triggers');
is(sql($node, 'dst_data', q{SELECT relrowsecurity FROM pg_class WHERE oid = 'idem.idem_keys'::regclass}),
	'f', 'data-only restore: the record is loaded but not applied');
for my $q (q{SELECT idem.idem_claim('k-new', scope => 'tenant_a')},
	q{SELECT idem.idem_lookup('k-b', scope => 'tenant_b')},
	q{SELECT idem.idem_complete('shared-key', '{}', scope => 'tenant_b')},
	q{SELECT idem.idem_forget('k-b', scope => 'tenant_b')},
	q{SELECT idem.idem_claim_batch(ARRAY['m-1'], scope => 'tenant_a')},
	q{SELECT idem.idem_reap()})
{
	is(sqlstate_as($node, 'dst_data', 'tenant_a', 'tenant_a', $q), 'IK006',
		"not in force: a confined role is refused: $q");
}
my (undef, undef, $e2) = $node->psql('dst_data', q{SELECT idem.idem_claim('k-new', scope => 'tenant_a')},
	extra_params => [ '-U', 'tenant_a' ]);
like($e2, qr/row-level security of idem_keys is not in force/, 'IK006 says what is wrong');
is(sql($node, 'dst_data', q{SELECT outcome FROM idem.idem_claim('admin-key', scope => 'ops')}), 'claimed',
	'not in force: a superuser is served (row-level security never applies to it)');
is(sqlstate_as($node, 'dst_data', 'tenant_a', 'tenant_a', q{SELECT count(*) FROM idem.idem_stalled}), 'IK006',
	'not in force: idem_stalled refuses a confined role');
is((as_role($node, 'dst_data', 'tenant_a', 'tenant_a', q{SELECT count(*) FROM idem.idem_scope_stats}))[0], '0',
	'not in force: idem_scope_stats shows a confined role no scope');
is(sql($node, 'dst_data', q{SELECT string_agg(scope, ',' ORDER BY scope) FROM idem.idem_scope_stats}), 'ops,tenant_a',
	'... while the superuser sees the scopes (tenant_a: its refused calls count as attempts)');
is(sql($node, 'dst_data', 'SELECT idem.idem_row_security_apply()'), '2', 'idem_row_security_apply() puts both policies back');
is(sqlstate_as($node, 'dst_data', 'tenant_a', 'tenant_a', q{SELECT idem.idem_claim('k-b', scope => 'tenant_b')}),
	'42501', 'after apply: tenant a is isolated again');
is((as_role($node, 'dst_data', 'tenant_a', 'tenant_a', q{SELECT outcome FROM idem.idem_claim('k-new', scope => 'tenant_a')}))[0],
	'claimed', 'after apply: tenant a is served');

# ---- a policy naming a role the new cluster lacks: the restore goes on, confined roles refused
sql($node, 'src', q{CREATE ROLE auditor; CREATE POLICY audit ON idem.idem_keys FOR SELECT TO auditor USING (true);});
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$tmp/audit.dump", '-d', $node->connstr('src') ], 'pg_dump with a policy for auditor');
sql($other, 'postgres', 'CREATE DATABASE no_auditor');    # this cluster has no role auditor
$other->run_log([ 'pg_restore', '-d', $other->connstr('no_auditor'), "$tmp/audit.dump" ]);
is(sql($other, 'no_auditor', q{SELECT count(*) FROM idem.idem_policies}), '3', 'the record of three policies is restored');
is(sqlstate_as($other, 'no_auditor', 'tenant_a', 'tenant_a', q{SELECT idem.idem_lookup('k-b', scope => 'tenant_b')}),
	'IK006', 'a policy that could not be re-created: confined roles are refused, never shown too much');
sql($other, 'postgres', 'CREATE ROLE auditor');
is(sql($other, 'no_auditor', 'SELECT idem.idem_row_security_apply()'), '3', 'once the role exists, apply re-creates all three');
is(sqlstate_as($other, 'no_auditor', 'tenant_a', 'tenant_a', q{SELECT idem.idem_claim('k-b', scope => 'tenant_b')}),
	'42501', 'and the tenants are isolated');

# ---- the record follows changes, and only changes
sql($node, 'src', q{ALTER POLICY tenant ON idem.idem_keys USING (scope = current_setting('app.tenant') OR scope = 'shared')});
like(sql($node, 'src', q{SELECT using_expr FROM idem.idem_policies WHERE name = 'tenant'}), qr/'shared'/, 'ALTER POLICY is recorded');
sql($node, 'src', q{DROP POLICY audit ON idem.idem_keys});
is(sql($node, 'src', q{SELECT string_agg(name, ',' ORDER BY name) FROM idem.idem_policies}), 'tenant,tenant_role', 'DROP POLICY is recorded');
sql($node, 'src', q{ALTER TABLE idem.idem_keys FORCE ROW LEVEL SECURITY});
is(sql($node, 'src', q{SELECT enabled::text || forced::text FROM idem.idem_row_security}), 'truetrue', 'FORCE is recorded');
sql($node, 'src', q{ALTER TABLE idem.idem_keys NO FORCE ROW LEVEL SECURITY});
# a record not yet applied is not overwritten by DDL that does not change the flags
sql($node, 'src', q{ALTER TABLE idem.idem_row_security DISABLE TRIGGER idem_row_security_restore;
	UPDATE idem.idem_row_security SET forced = true;
	ALTER TABLE idem.idem_row_security ENABLE TRIGGER idem_row_security_restore;});
sql($node, 'src', q{ALTER TABLE idem.idem_keys SET (autovacuum_vacuum_scale_factor = 0.02)});
is(sql($node, 'src', q{SELECT enabled::text || forced::text FROM idem.idem_row_security}), 'truetrue',
	'an ALTER TABLE that leaves the flags alone does not overwrite the record');
sql($node, 'src', q{SELECT idem.idem_row_security_apply()});
is(sql($node, 'src', q{SELECT relforcerowsecurity FROM pg_class WHERE oid = 'idem.idem_keys'::regclass}), 't',
	'apply makes the table what the record says');
sql($node, 'src', q{ALTER TABLE idem.idem_keys NO FORCE ROW LEVEL SECURITY});
# DDL by a role that cannot read the record goes through the event triggers unharmed
sql($node, 'src', q{CREATE SCHEMA t_a AUTHORIZATION tenant_a});
my ($o3, $e3) = as_role($node, 'src', 'tenant_a', 'tenant_a',
	q{CREATE TABLE t_a.notes (n int); ALTER TABLE t_a.notes ENABLE ROW LEVEL SECURITY; CREATE POLICY p ON t_a.notes USING (true); DROP POLICY p ON t_a.notes;});
is($e3, '', 'a tenant runs DDL on its own table');
sql($node, 'src', q{ALTER TABLE idem.idem_keys DISABLE ROW LEVEL SECURITY});
is(sql($node, 'src', q{SELECT count(*) FROM idem.idem_row_security}), '0', 'DISABLE is recorded (no row: nothing to restore)');

# ---- 1.4 -> 1.5 takes over policies made by hand; 1.5 -> 1.6 carries the record over
sql($node, 'postgres', 'CREATE DATABASE old');
sql($node, 'old', q{
	CREATE SCHEMA idem;
	CREATE EXTENSION idempotency SCHEMA idem VERSION '1.4';
	GRANT USAGE ON SCHEMA idem TO tenant_a, tenant_b;
	GRANT SELECT, INSERT, UPDATE, DELETE ON idem.idem_keys TO tenant_a, tenant_b;
} . $policies . q{
	SELECT idem.idem_claim('k-a', scope => 'tenant_a');
	SELECT idem.idem_claim('k-b', scope => 'tenant_b');
	SELECT idem.idem_claim('shared-key', scope => 'tenant_a');
	SELECT idem.idem_claim('shared-key', scope => 'tenant_b');
	ALTER EXTENSION idempotency UPDATE TO '1.5';});
is(sql($node, 'old', q{SELECT (SELECT enabled::text FROM idem.idem_row_security) || ' ' || string_agg(name, ',' ORDER BY name) FROM idem.idem_policies}),
	'true tenant,tenant_role', '1.4 -> 1.5 records the row-level security made by hand');
my $record_15 = sql($node, 'old', q{SELECT string_agg(concat_ws(' ', name, permissive, roles, using_expr, check_expr), '; ' ORDER BY name) FROM idem.idem_policies});
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$tmp/old15.dump", '-d', $node->connstr('old') ], 'pg_dump under 1.5');
sql($node, 'old', q{ALTER EXTENSION idempotency UPDATE TO '1.6'});
is(sql($node, 'old', q{SELECT string_agg(concat_ws(' ', name, permissive, roles, using_expr, check_expr), '; ' ORDER BY name) FROM idem.idem_policies}),
	$record_15, '1.5 -> 1.6 carries the record over');
is(sql($node, 'old', q{SELECT string_agg(name || '=' || named, ',' ORDER BY name) FROM idem.idem_policies}),
	'tenant=,tenant_role=', '... and records what its policies name (nothing but built-ins here)');
is(sql($node, 'old', q{SELECT count(*) FROM pg_proc WHERE prosecdef AND pronamespace = 'idem'::regnamespace}), '0',
	'1.6 has no SECURITY DEFINER function');
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$tmp/old.dump", '-d', $node->connstr('old') ], 'pg_dump of the updated database');
sql($node, 'postgres', 'CREATE DATABASE old_restored');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('old_restored'), "$tmp/old.dump" ],
	'pg_restore of the updated database');
is(sql($node, 'old_restored', q{SELECT relrowsecurity::text || ' ' || (SELECT count(*) FROM pg_policy WHERE polrelid = 'idem.idem_keys'::regclass)
	FROM pg_class WHERE oid = 'idem.idem_keys'::regclass}), 'true 2', 'updated from 1.4: the policies survive the restore');
is(sqlstate_as($node, 'old_restored', 'tenant_a', 'tenant_a', q{SELECT idem.idem_claim('k-b', scope => 'tenant_b')}),
	'42501', 'updated from 1.4: the tenants stay isolated after the restore');

# ---- a 1.5 record not in force when updated to 1.6 (a data-only restore, not applied yet)
sql($node, 'postgres', 'CREATE DATABASE pending15');
sql($node, 'pending15', q{
	CREATE SCHEMA idem;
	CREATE EXTENSION idempotency SCHEMA idem VERSION '1.5';
	GRANT USAGE ON SCHEMA idem TO tenant_a, tenant_b;
	GRANT SELECT, INSERT, UPDATE, DELETE ON idem.idem_keys TO tenant_a, tenant_b;});
$node->command_ok([ 'pg_restore', '--data-only', '--disable-triggers', '--exit-on-error',
	'-d', $node->connstr('pending15'), "$tmp/old15.dump" ], '1.5: data-only restore with --disable-triggers');
sql($node, 'pending15', q{ALTER EXTENSION idempotency UPDATE TO '1.6'});
is(sql($node, 'pending15', q{SELECT (SELECT enabled FROM idem.idem_row_security) || ' ' || string_agg(name || '=' || coalesce(named, 'null'), ',' ORDER BY name) FROM idem.idem_policies}),
	'true tenant=null,tenant_role=null', '1.5 -> 1.6 carries a record that is not in force as it is');
is(sqlstate_as($node, 'pending15', 'tenant_a', 'tenant_a', q{SELECT idem.idem_lookup('k-b', scope => 'tenant_b')}),
	'IK006', 'carried over not in force: the tenants are refused');
is(sql($node, 'pending15', 'SELECT idem.idem_row_security_apply()'), '2', '1.6 applies the carried record');
is(sql($node, 'pending15', q{SELECT string_agg(name || '=' || coalesce(named, 'null'), ',' ORDER BY name) FROM idem.idem_policies}),
	'tenant=,tenant_role=', '... and records what its policies name');
is(sqlstate_as($node, 'pending15', 'tenant_a', 'tenant_a', q{SELECT idem.idem_claim('k-b', scope => 'tenant_b')}),
	'42501', '... and the tenants are isolated');

$other->stop;
$node->stop;
done_testing();
