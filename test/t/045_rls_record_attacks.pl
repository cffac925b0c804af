# The record of idem_keys' row-level security attacked by ordinary roles (1.6; docs/security.md
# "Row-level security across dumps and restores").
#
# A database whose record is loaded but not in force (a data-only restore with triggers disabled):
#  - a role with nothing but PUBLIC's privileges runs DDL on its own temporary table with code
#    that sets the settings 1.5 trusted (a CHECK constraint calling set_config, SET), writes the
#    record tables, calls idem_row_security_apply() and the triggers' functions: the record stays
#    as it was, every confined role is refused (IK006), and the repair restores both policies with
#    row-level security enabled;
#  - a session opened (and served) before the restore is refused too, at once, and served again
#    once the record is applied.
# A policy calling a function that is renamed after it was recorded, and a permissive function
# planted under the old name by a role with CREATE on the schema: after pg_dump and pg_restore the
# policy is not bound to the planted function (a WARNING names it) and the tenants are refused.
# A restore by a non-superuser database owner (--no-owner) to whom a superuser gave idem_keys, as
# docs/upgrading.md says: the tenants are isolated; by one only granted privileges on idem_keys
# (the checklist not followed): the keys are not loaded. A role of a policy renamed, or taken out of it
# by DROP OWNED (no event trigger sees either): the tenants are refused until the owner records
# the policy again.
# The owner of idem_keys (no superuser) writes a record whose expression ends the CREATE POLICY and
# starts other statements: neither a superuser's idem_row_security_apply() nor a superuser's
# restore of the database runs them.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my $node = PostgreSQL::Test::Cluster->new('attacks');
$node->init(extra => [ '--encoding=UTF8', '--locale=C' ]);
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_enabled = off
});
$node->start;
my $tmp = PostgreSQL::Test::Utils::tempdir;

sub sql { my ($db, $q) = @_; return $node->safe_psql($db, $q); }

# (stdout, stderr) of $q run as $role
sub as_role
{
	my ($db, $role, $q) = @_;
	my ($rc, $out, $err) = $node->psql($db, "\\set VERBOSITY sqlstate\n$q", extra_params => [ '-U', $role ]);
	return ($out, $err);
}
sub sqlstate_as
{
	my ($out, $err) = as_role(@_);
	return $err =~ /ERROR:\s+(\S{5})/ ? $1 : "no error: $out$err";
}

sql('postgres', q{
	CREATE ROLE tenant_a LOGIN;
	CREATE ROLE tenant_b LOGIN;
	CREATE ROLE mallory LOGIN;
	CREATE ROLE app_admin LOGIN;
	CREATE ROLE planter LOGIN;
	CREATE ROLE dbowner LOGIN;
});
my $setup = q{
	CREATE SCHEMA idem;
	CREATE EXTENSION idempotency SCHEMA idem;
	GRANT USAGE ON SCHEMA idem TO PUBLIC;
	GRANT SELECT, INSERT, UPDATE, DELETE ON idem.idem_keys TO tenant_a, tenant_b;
};
my $policies = q{
	ALTER TABLE idem.idem_keys ENABLE ROW LEVEL SECURITY;
	CREATE POLICY tenant ON idem.idem_keys USING (scope = current_user) WITH CHECK (scope = current_user);
	CREATE POLICY tenant_role ON idem.idem_keys AS RESTRICTIVE TO tenant_a, tenant_b
		USING (scope = current_user) WITH CHECK (scope = current_user);
};
sub claim_keys
{
	my ($db) = @_;
	for my $t (qw(tenant_a tenant_b))
	{
		my ($out, $err) = as_role($db, $t, qq{
			SELECT outcome FROM idem.idem_claim('k-$t', '{"n": 1}', scope => '$t', ttl => '7 days');
			SELECT state FROM idem.idem_complete('k-$t', '{"secret": "$t"}', 201, scope => '$t');});
		is($err, '', "$db: $t stores a key");
	}
}
my $record_sql = q{SELECT (SELECT coalesce(string_agg(enabled || ' ' || forced, ','), 'none') FROM idem.idem_row_security)
	|| ' | ' || (SELECT coalesce(string_agg(name || ' ' || permissive || ' ' || array_to_string(roles, ',') || ' '
	|| coalesce(using_expr, '-') || ' ' || coalesce(check_expr, '-'), '; ' ORDER BY name), 'none') FROM idem.idem_policies)};

sql('postgres', 'CREATE DATABASE src');
sql('src', $setup . $policies);
claim_keys('src');
my $recorded = sql('src', $record_sql);
like($recorded, qr/^true false \| tenant true public .*; tenant_role false tenant_a,tenant_b /, 'the source records both policies');
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$tmp/src.dump", '-d', $node->connstr('src') ], 'pg_dump -Fc');

# ---- a pooled session opened before a data-only restore
sql('postgres', 'CREATE DATABASE dst');
sql('dst', $setup);
my $pooled = $node->background_psql('dst', extra_params => [ '-U', 'tenant_a' ], on_error_stop => 0);
is($pooled->query_safe(q{SELECT outcome FROM idem.idem_claim('early', scope => 'tenant_a')}), 'claimed',
	'a pooled session is served before the restore (no row-level security recorded yet)');
$node->command_ok([ 'pg_restore', '--data-only', '--disable-triggers', '--exit-on-error',
	'-d', $node->connstr('dst'), "$tmp/src.dump" ], 'data-only restore with --disable-triggers');
is(sql('dst', $record_sql), $recorded, 'the record is loaded');
is(sql('dst', q{SELECT relrowsecurity FROM pg_class WHERE oid = 'idem.idem_keys'::regclass}), 'f', '... and not applied');

# Refused everywhere: a new session, and the session opened before the restore.
sub refused_everywhere
{
	my ($label) = @_;
	is(sqlstate_as('dst', 'tenant_a', q{SELECT idem.idem_lookup('k-tenant_b', scope => 'tenant_b')}), 'IK006',
		"$label: a new session of tenant_a is refused");
	$pooled->{stderr} = '';    # BackgroundPsql keeps the stderr of earlier queries
	my ($out) = $pooled->query(q{\set VERBOSITY sqlstate
SELECT (idem.idem_lookup('k-tenant_b', scope => 'tenant_b')).response});
	like($pooled->{stderr}, qr/IK006/, "$label: the session opened before the restore is refused");
	unlike($out, qr/secret/, "$label: ... and is shown no other tenant's response");
	is(sqlstate_as('dst', 'tenant_b', q{SELECT idem.idem_claim('k-tenant_a', scope => 'tenant_a')}), 'IK006',
		"$label: tenant_b is refused");
}
refused_everywhere('after the restore');

# ---- the attacks of a role with PUBLIC's privileges only
my @attacks = (
	[ 'a CHECK constraint sets the 1.5 setting during an ALTER TABLE of its own temporary table', q{
		CREATE TEMP TABLE x(a int); INSERT INTO x VALUES (1);
		ALTER TABLE x ADD CONSTRAINT c CHECK (set_config('idempotency_row_security.before', 'x', true) <> '');} ],
	[ 'the same with row-level security subcommands on its own table', q{
		CREATE TEMP TABLE y(a int); INSERT INTO y VALUES (1);
		ALTER TABLE y ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY,
			ADD CONSTRAINT c CHECK (set_config('idempotency_row_security.before', 'x', true) <> ''
			                        AND set_config('idempotency_row_security.applying', 'off', true) <> '');
		ALTER TABLE y DISABLE ROW LEVEL SECURITY, NO FORCE ROW LEVEL SECURITY;} ],
	[ 'a temporary table named idem_keys, with policies, and settings set', q{
		SET idempotency_row_security.applying = on; SET idempotency_row_security.before = 'falsefalse';
		CREATE TEMP TABLE idem_keys(scope text);
		ALTER TABLE idem_keys ENABLE ROW LEVEL SECURITY;
		CREATE POLICY tenant ON idem_keys USING (true);
		ALTER POLICY tenant ON idem_keys RENAME TO other;
		DROP POLICY other ON idem_keys;
		ALTER TABLE idem_keys DISABLE ROW LEVEL SECURITY;} ],
);
for my $attack (@attacks)
{
	my ($label, $q) = @$attack;
	my ($out, $err) = as_role('dst', 'mallory', $q);
	is($err, '', "mallory: $label: runs");
	is(sql('dst', $record_sql), $recorded, "mallory: $label: the record is unchanged");
	refused_everywhere("after mallory: $label");
}
for my $q (q{DELETE FROM idem.idem_row_security}, q{TRUNCATE idem.idem_policies},
	q{INSERT INTO idem.idem_policies (name, permissive, command, roles) VALUES ('open', true, 'ALL', '{public}')},
	q{SELECT idem.idem_row_security_apply()}, q{ALTER TABLE idem.idem_keys DISABLE ROW LEVEL SECURITY},
	q{SELECT idem.idem_row_security_restore()})
{
	my $state = sqlstate_as('dst', 'mallory', $q);
	ok($state eq '42501' || $state eq '0A000', "mallory cannot: $q ($state)");
}
is(sql('dst', $record_sql), $recorded, 'after every attack the record is as the restore loaded it');
# a tenant with every privilege on idem_keys but no ownership fares no better
is(sqlstate_as('dst', 'tenant_a', q{SELECT idem.idem_row_security_apply()}), '42501',
	'a tenant cannot apply the record');
is(sqlstate_as('dst', 'tenant_a', q{DELETE FROM idem.idem_policies}), '42501', 'a tenant cannot erase the record');

# The documented repair puts everything back, row-level security enabled.
is(sql('dst', 'SELECT idem.idem_row_security_apply()'), '2', 'the owner applies the record: two policies');
is(sql('dst', q{SELECT relrowsecurity || ' ' || (SELECT string_agg(polname, ',' ORDER BY polname) FROM pg_policy
	WHERE polrelid = 'idem.idem_keys'::regclass) FROM pg_class WHERE oid = 'idem.idem_keys'::regclass}),
	'true tenant,tenant_role', 'row-level security is enabled with both policies');
is(sqlstate_as('dst', 'tenant_a', q{SELECT idem.idem_claim('k-tenant_b', scope => 'tenant_b')}), '42501',
	'tenant_a is isolated from tenant_b');
$pooled->{stderr} = '';
is($pooled->query_safe(q{SELECT (idem.idem_lookup('k-tenant_b', scope => 'tenant_b')) IS NULL}), 't',
	'the session opened before the restore is served again, and isolated');
is($pooled->query_safe(q{SELECT (idem.idem_lookup('k-tenant_a', scope => 'tenant_a')).response}), '{"secret": "tenant_a"}',
	'... and sees its own key');
$pooled->quit;

# ---- a renamed function, and a permissive one planted under its old name
sql('postgres', 'CREATE DATABASE fn_src');
sql('fn_src', q{
	CREATE SCHEMA app AUTHORIZATION app_admin;
	GRANT USAGE ON SCHEMA app TO PUBLIC;
	GRANT CREATE ON SCHEMA app TO planter;
	SET ROLE app_admin;
	CREATE FUNCTION app.tenant_allowed(s text) RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT s = current_user $$;
	RESET ROLE;
} . $setup . q{
	ALTER TABLE idem.idem_keys ENABLE ROW LEVEL SECURITY;
	CREATE POLICY tenant_fn ON idem.idem_keys USING (app.tenant_allowed(scope)) WITH CHECK (app.tenant_allowed(scope));
});
claim_keys('fn_src');
is(sql('fn_src', q{SELECT named FROM idem.idem_policies WHERE name = 'tenant_fn'}),
	'function app.tenant_allowed(pg_catalog.text) owned by app_admin', 'the record names the function and its owner');
sql('fn_src', q{ALTER FUNCTION app.tenant_allowed(text) RENAME TO may_see});
my ($o1, $e1) = as_role('fn_src', 'planter',
	q{CREATE FUNCTION app.tenant_allowed(s text) RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT true $$;});
is($e1, '', 'planter defines a permissive function under the old name');
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$tmp/fn.dump", '-d', $node->connstr('fn_src') ], 'pg_dump of the renamed state');
sql('postgres', 'CREATE DATABASE fn_dst');
my ($rc, $out, $err);
# -v: pg_restore shows the server's warnings in verbose mode only
IPC::Run::run([ 'pg_restore', '-v', '-d', $node->connstr('fn_dst'), "$tmp/fn.dump" ], '>', \$out, '2>', \$err);
like($err, qr/WARNING:.*policy "tenant_fn" of idem_keys names objects other than those recorded/,
	'the restore warns, naming the policy');
is(sql('fn_dst', q{SELECT count(*) FROM pg_policy WHERE polrelid = 'idem.idem_keys'::regclass}), '0',
	'the policy is not bound to the planted function');
is(sqlstate_as('fn_dst', 'tenant_a', q{SELECT idem.idem_lookup('k-tenant_b', scope => 'tenant_b')}), 'IK006',
	'the tenants are refused (IK006), not shown each other\'s keys');
my ($o2) = as_role('fn_dst', 'tenant_a', q{SELECT (idem.idem_lookup('k-tenant_b', scope => 'tenant_b')).response});
unlike($o2, qr/secret/, '... no response of another tenant');
my (undef, $e2) = as_role('fn_dst', 'postgres', q{SELECT idem.idem_row_security_apply()});
like($e2, qr/IK006.*|names objects other than those recorded/, 'a manual apply is refused too (IK006)');
# the owner corrects the record once it has checked the objects: then it applies
sql('fn_dst', q{UPDATE idem.idem_policies SET using_expr = 'app.may_see(scope)', check_expr = 'app.may_see(scope)',
	named = 'function app.may_see(pg_catalog.text) owned by app_admin' WHERE name = 'tenant_fn'});
is(sql('fn_dst', q{SELECT string_agg(polname, ',') FROM pg_policy WHERE polrelid = 'idem.idem_keys'::regclass}),
	'tenant_fn', 'a corrected record, written by the owner, is applied');
is(sqlstate_as('fn_dst', 'tenant_a', q{SELECT idem.idem_claim('k-tenant_b', scope => 'tenant_b')}), '42501',
	'and the tenants are isolated');

# ---- a restore by a database owner that is not a superuser, as docs/upgrading.md says
sql('postgres', 'CREATE DATABASE owned OWNER dbowner');
sql('owned', q{
	CREATE SCHEMA idem AUTHORIZATION dbowner;
	CREATE EXTENSION idempotency SCHEMA idem;
	ALTER TABLE idem.idem_keys OWNER TO dbowner;
});
is(sql('owned', q{SELECT string_agg(relname || ' ' || pg_get_userbyid(relowner), ',' ORDER BY relname) FROM pg_class
	WHERE relname IN ('idem_keys', 'idem_row_security', 'idem_policies')}),
	'idem_keys dbowner,idem_policies dbowner,idem_row_security dbowner', 'the record follows idem_keys to its new owner');
IPC::Run::run([ 'pg_restore', '-v', '--no-owner', '-U', 'dbowner', '-d', $node->connstr('owned'), "$tmp/src.dump" ],
	'>', \$out, '2>', \$err);
like($err, qr/processing data for table "idem.idem_policies"/, 'the restore loads the record');
unlike($err, qr/(ERROR|WARNING):.*(idem_policies|idem_row_security|row-level security)/,
	'the record is restored by the database owner without an error or a warning')
  or diag $err;
is(sql('owned', q{SELECT relrowsecurity || ' ' || (SELECT string_agg(polname, ',' ORDER BY polname) FROM pg_policy
	WHERE polrelid = 'idem.idem_keys'::regclass) FROM pg_class WHERE oid = 'idem.idem_keys'::regclass}),
	'true tenant,tenant_role', 'row-level security and both policies are in force');
is(sql('owned', 'SELECT count(*) FROM idem.idem_keys'), '2', 'the keys are restored');
is(sqlstate_as('owned', 'tenant_a', q{SELECT idem.idem_claim('k-tenant_b', scope => 'tenant_b')}), '42501',
	'the tenants are isolated');

# ---- a database owner that was only granted privileges on idem_keys (the checklist not followed)
sql('postgres', 'CREATE DATABASE granted OWNER dbowner');
sql('granted', q{
	CREATE SCHEMA idem AUTHORIZATION dbowner;
	CREATE EXTENSION idempotency SCHEMA idem;
	GRANT SELECT, INSERT, UPDATE, DELETE ON idem.idem_keys TO dbowner;
});
IPC::Run::run([ 'pg_restore', '--no-owner', '-U', 'dbowner', '-d', $node->connstr('granted'), "$tmp/src.dump" ],
	'>', \$out, '2>', \$err);
like($err, qr/only the owner of idem_keys can load keys into it with COPY/, 'its COPY of the keys is refused');
like($err, qr/permission denied for table idem_(policies|row_security)/, '... as its COPY of the record');
is(sql('granted', 'SELECT count(*) FROM idem.idem_keys'), '0', 'no key is loaded: none is readable');
my ($o5) = as_role('granted', 'tenant_a', q{SELECT (idem.idem_lookup('k-tenant_b', scope => 'tenant_b')).response});
unlike($o5, qr/secret/, 'a tenant is shown no other tenant\'s key');
(undef, undef, $err) = $node->psql('granted', q{SET row_security = off;
COPY idem.idem_keys (scope, key, state, attempt, created_at, expires_at) FROM stdin;
x	y	pending	1	2026-01-01	2099-01-01
\.
}, extra_params => [ '-U', 'dbowner' ]);
like($err, qr/only the owner of idem_keys can load keys into it with COPY/, 'a COPY by that role as a restore runs it is refused too');
(undef, $out, $err) = $node->psql('granted', q{COPY idem.idem_keys (scope, key, state, attempt, created_at, expires_at) FROM stdin;
x	y	pending	1	2026-01-01	2099-01-01
\.
SELECT count(*) FROM idem.idem_keys;}, extra_params => [ '-U', 'dbowner' ]);
is($out, '1', 'a COPY with row_security on (a tool moving keys) is the role\'s own business, as an INSERT is');
is((as_role('granted', 'dbowner', q{INSERT INTO idem.idem_keys (scope, key, state, attempt, created_at, expires_at)
	VALUES ('x', 'z', 'pending', 1, now(), now() + interval '1 day') RETURNING key}))[0], 'z',
	'an INSERT by a role with the privilege is PostgreSQL\'s business, as before');

# ---- role changes the event triggers cannot see are detected: refused until recorded again
sql('postgres', 'ALTER ROLE tenant_b RENAME TO tenant_bee');
my ($o3, $e3) = as_role('owned', 'tenant_a', q{\set VERBOSITY verbose
SELECT idem.idem_lookup('k-tenant_b', scope => 'tenant_b')});
like($e3, qr/IK006.*roles of policy "tenant_role" are not those recorded/s,
	'a role of a policy renamed: the record would restore another policy, so the tenants are refused');
sql('owned', q{SET ROLE dbowner; ALTER POLICY tenant_role ON idem.idem_keys TO tenant_a, tenant_bee});
is(sql('owned', q{SELECT array_to_string(roles, ',') FROM idem.idem_policies WHERE name = 'tenant_role'}),
	'tenant_a,tenant_bee', 'ALTER POLICY by the owner records the new name');
is(sqlstate_as('owned', 'tenant_a', q{SELECT idem.idem_claim('k-tenant_b', scope => 'tenant_b')}), '42501',
	'and the tenants are served, isolated');
sql('owned', 'DROP OWNED BY tenant_bee');
is(sql('owned', q{SELECT array_to_string(polroles::regrole[], ',') FROM pg_policy WHERE polname = 'tenant_role'}),
	'tenant_a', 'DROP OWNED BY takes the role out of the policy');
is(sqlstate_as('owned', 'tenant_a', q{SELECT idem.idem_lookup('k-tenant_b', scope => 'tenant_b')}), 'IK006',
	'... which the record does not show: refused');

# ---- a record written to run more than a policy when a superuser applies or restores it
sql('postgres', 'CREATE DATABASE planted OWNER dbowner');
sql('planted', q{
	CREATE SCHEMA idem AUTHORIZATION dbowner;
	CREATE EXTENSION idempotency SCHEMA idem;
	ALTER TABLE idem.idem_keys OWNER TO dbowner;
});
my $planted = q{true); ALTER ROLE dbowner SUPERUSER; CREATE POLICY planted ON idem.idem_keys USING (true};
(undef, $out, $err) = $node->psql('planted', qq{ALTER TABLE idem.idem_keys ENABLE ROW LEVEL SECURITY;
INSERT INTO idem.idem_policies (name, permissive, command, roles, using_expr)
	VALUES ('p', true, 'ALL', '{public}', \$\$$planted\$\$);}, extra_params => [ '-U', 'dbowner' ]);
like($err, qr/WARNING:.*policy "p" of idem_keys is not re-created: its record is not one policy/,
	'the owner writes the record: its trigger refuses the policy (a WARNING)');
sub superuser_of { return sql('postgres', q{SELECT rolsuper FROM pg_roles WHERE rolname = 'dbowner'}); }
(undef, $out, $err) = $node->psql('planted', q{\set VERBOSITY sqlstate
SELECT idem.idem_row_security_apply()});
like($err, qr/ERROR:\s+IK006/, "a superuser's idem_row_security_apply() refuses it (IK006)");
is(superuser_of(), 'f', '... and runs none of its statements');
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$tmp/planted.dump", $node->connstr('planted') ], 'dump of that database');
sql('postgres', 'CREATE DATABASE planted_copy OWNER dbowner');
IPC::Run::run([ 'pg_restore', '-v', '-d', $node->connstr('planted_copy'), "$tmp/planted.dump" ], '>', \$out, '2>', \$err);
like($err, qr/row-level security of idem_keys was not restored: policy "p" of idem_keys is not re-created/,
	"a superuser's restore says the record was not applied");
is(superuser_of(), 'f', '... and runs none of its statements either');
is(sql('planted_copy', q{SELECT count(*) FROM pg_policy WHERE polname = 'planted'}), '0', '... nor its extra policy');

$node->stop;
done_testing();
