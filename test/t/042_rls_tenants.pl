# Multi-tenant isolation with row-level security on idem_keys (issue 5, "Security"; docs/api.md
# "Privileges", docs/security.md).
#
# idem_keys gets the documented tenant policy
#     USING (scope = current_setting('app.tenant')) WITH CHECK (same)
# and two tenant roles get the documented privileges (SELECT, INSERT, UPDATE for claim, complete,
# fail and lookup; DELETE besides for reaping).  A tenant session (app.tenant set to its scope) can
# neither read (lookup: NULL), claim (42501 "new row violates row-level security policy"; never a
# replay of the other tenant's response, never a takeover), complete or fail (IK003: the row does
# not exist for it), nor reap another tenant's keys, and nothing of the other tenant's rows changes
# (not even a new row version); its own keys go through the whole state machine as usual
# (claimed, in_progress, replay, IK001, takeovers, IK002, IK004, re-entrant calls, waits,
# 40001 under REPEATABLE READ, reaping).
#
# Then what the policy does not do, documented in docs/security.md:
# - app.tenant is the session's own setting: a client that can run SQL as the shared role can
#   SET it to another tenant.  A policy bound to the role (a RESTRICTIVE one here) closes that.
# - After RESET app.tenant the setting is '' and the session is in the '' scope (the default one).
# - The functions run the policy's SQL with search_path = pg_catalog, pg_temp: a policy function
#   that relies on the caller's search_path fails (42P01); one with SET search_path works.
# - A WITH CHECK violation is PostgreSQL's error: with a literal body, the statement is logged.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

my $node = PostgreSQL::Test::Cluster->new('rls');
$node->init(extra => [ '--encoding=UTF8', '--locale=C' ]);
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
# the tenants reap by hand here
idempotency.reaper_enabled = off
log_statement = none
});
$node->start;

sub sql { return $node->safe_psql('postgres', $_[0]); }
sql(q{
	CREATE EXTENSION idempotency;
	CREATE ROLE tenant_a LOGIN;
	CREATE ROLE tenant_b LOGIN;
	GRANT SELECT, INSERT, UPDATE, DELETE ON idem_keys TO tenant_a, tenant_b;
	ALTER TABLE idem_keys ENABLE ROW LEVEL SECURITY;
	CREATE POLICY tenant ON idem_keys
		USING (scope = current_setting('app.tenant'))
		WITH CHECK (scope = current_setting('app.tenant'));
});

# as_tenant(t, sql[, tenant]): runs sql as role tenant_<t> with app.tenant = '<tenant>' (default
# '<t>'); returns (stdout, stderr)
sub as_tenant
{
	my ($t, $q, $tenant) = @_;
	$tenant //= $t;
	my ($rc, $out, $err) = $node->psql('postgres', "SET app.tenant = '$tenant';\n$q",
		extra_params => [ '-U', "tenant_$t" ]);
	return ($out, $err);
}
sub ok_as
{
	my ($t, $q) = @_;
	my ($out, $err) = as_tenant($t, $q);
	die "as tenant $t: $q\n$err" if $err ne '';
	return $out;
}
sub err_as
{
	my ($t, $q) = @_;
	my ($out, $err) = as_tenant($t, $q);
	return $err;
}
# every row of a scope, physical version included: nothing may change, not even a new version
sub scope_sum
{
	return sql(qq{SELECT count(*) || ' ' || md5(string_agg(ctid::text || xmin::text || k::text, ';' ORDER BY key))
		FROM idem_keys k WHERE scope = '$_[0]'});
}

# ---- tenant b's keys
ok_as('b', q{
	SELECT idem_claim('b-done', '{"b": 1}', 'b');
	SELECT idem_complete('b-done', '{"secret": "of b"}', 201, 'b');
	SELECT idem_claim('b-pending', '{"b": 2}', 'b', lease => '1 hour');
	SELECT idem_claim('b-expired', NULL, 'b', ttl => '1 millisecond', lease => '1 millisecond');
	SELECT idem_claim('b-failed', '{"b": 3}', 'b');
	SELECT idem_fail('b-failed', '{"error": "retry me"}', 503, retryable => true, scope => 'b');
	SELECT idem_claim('shared', '{"who": "b"}', 'b');
	SELECT idem_complete('shared', '{"owner": "b"}', 200, 'b');
});
ok_as('a', q{SELECT idem_claim('a-expired', NULL, 'a', ttl => '1 millisecond', lease => '1 millisecond')});
sleep 0.05;
is(sql(q{SELECT string_agg(scope || '/' || key || '/' || state, ' ' ORDER BY scope, key) FROM idem_keys}),
	'a/a-expired/pending b/b-done/succeeded b/b-expired/pending b/b-failed/failed b/b-pending/pending b/shared/succeeded',
	'the superuser (exempt from RLS) sees both tenants\' keys');
my $b_before = scope_sum('b');

# ---- tenant a against tenant b's keys
is(ok_as('a', q{
	SELECT (idem_lookup('b-done', 'b') IS NULL)::text || (idem_lookup('b-pending', 'b') IS NULL)::text
	       || (idem_lookup('b-failed', 'b') IS NULL)::text || (idem_lookup('shared', 'b') IS NULL)::text;
	SELECT count(*) FROM idem_keys;
	SELECT count(*) FROM idem_keys WHERE scope = 'b';
}), "truetruetruetrue\n1\n0", 'a: lookup of b\'s keys returns NULL; plain SQL sees only a\'s key');
# (a RESTRICTIVE policy is named in the message)
my $rls_violation = qr/ERROR:  new row violates row-level security policy (?:"\w+" )?for table "idem_keys"/;
like(err_as('a', q{SELECT * FROM idem_claim('b-done', '{"b": 1}', 'b')}), $rls_violation,
	'a: claim of b\'s finished key with b\'s request -> 42501, not a replay of b\'s response');
like(err_as('a', q{SELECT * FROM idem_claim('b-failed', '{"b": 3}', 'b')}), $rls_violation,
	'a: claim of b\'s retryable failed key -> 42501, not a takeover');
like(err_as('a', q{SELECT * FROM idem_claim('b-pending', '{"b": 2}', 'b')}), $rls_violation,
	'a: claim of b\'s pending key -> 42501, not in_progress');
like(err_as('a', q{SELECT * FROM idem_claim('b-new', NULL, 'b')}), $rls_violation,
	'a: a new key in b\'s scope -> 42501');
like(err_as('a', q{SELECT * FROM idem_claim('a-in-default-scope')}), $rls_violation,
	'a: a new key in the default scope \'\' -> 42501');
like(err_as('a', q{SELECT * FROM idem_complete('b-pending', '{"by": "a"}', 200, 'b')}),
	qr/ERROR:  idempotency key "b-pending" does not exist/, 'a: complete of b\'s pending key -> IK003');
like(err_as('a', q{SELECT * FROM idem_complete('b-pending', '{"by": "a"}', 200, 'b', attempt => 1)}),
	qr/ERROR:  idempotency key "b-pending" does not exist/, 'a: ... with b\'s attempt -> IK003');
like(err_as('a', q{SELECT * FROM idem_fail('b-pending', '{"by": "a"}', 500, true, 'b')}),
	qr/ERROR:  idempotency key "b-pending" does not exist/, 'a: fail of b\'s pending key -> IK003');
like(err_as('a', q{SELECT * FROM idem_fail('b-done', '{"by": "a"}', 500, false, 'b')}),
	qr/ERROR:  idempotency key "b-done" does not exist/, 'a: fail of b\'s finished key -> IK003, not IK004');
is(ok_as('a', q{SELECT idem_reap(); CALL idem_reap_all();}), "1\n0",
	'a: idem_reap deletes a\'s expired key only; idem_reap_all finds nothing more');
is(scope_sum('b'), $b_before, 'b\'s rows are unchanged, not even rewritten');
is(sql(q{SELECT count(*) FROM idem_keys WHERE key IN ('b-expired', 'a-expired')}), 1,
	'b\'s expired key is still there, a\'s is gone');
is(ok_as('a', q{SELECT outcome || ' ' || inserted FROM idem_claim('shared', '{"who": "a"}', 'a')}),
	'claimed true', 'a: the same key name in a\'s scope is a\'s own new key');

# ---- tenant a's own keys: the whole state machine
is(ok_as('a', q{SELECT outcome || ' ' || inserted || ' ' || attempt FROM idem_claim('a-1', '{"n": 1}', 'a')}),
	'claimed true 1', 'a: claim -> claimed, inserted');
is(ok_as('a', q{SELECT outcome || ' ' || (retry_after > '0') FROM idem_claim('a-1', '{"n": 1}', 'a')}),
	'in_progress true', 'a: claim again (another session) -> in_progress');
like(err_as('a', q{SELECT idem_claim('a-1', '{"n": 2}', 'a')}),
	qr/ERROR:  idempotency key "a-1" was already used with a different request/, 'a: another request -> IK001');
is(ok_as('a', q{SELECT state FROM idem_complete('a-1', '{"done": 1}', 201, 'a', attempt => 1)}),
	'succeeded', 'a: complete');
is(ok_as('a', q{SELECT outcome || ' ' || response_code || ' ' || response::text FROM idem_claim('a-1', '{"n": 1}', 'a')}),
	'replay 201 {"done": 1}', 'a: claim -> replay of the stored response');
like(err_as('a', q{SELECT idem_complete('a-1', '{}', 200, 'a')}),
	qr/ERROR:  idempotency key "a-1" is not pending/, 'a: complete again -> IK004');
is(ok_as('a', q{
	SELECT outcome FROM idem_claim('a-2', NULL, 'a');
	SELECT state FROM idem_fail('a-2', NULL, 503, true, 'a', 1);
	SELECT outcome || ' ' || inserted || ' ' || attempt FROM idem_claim('a-2', NULL, 'a');
}), "claimed\nfailed\nclaimed false 2", 'a: retryable failure -> takeover with attempt 2');
like(err_as('a', q{SELECT idem_complete('a-2', '{}', 200, 'a', attempt => 1)}),
	qr/ERROR:  attempt 1 of idempotency key "a-2" is stale/, 'a: the stale attempt -> IK002');
is(ok_as('a', q{SELECT state || ' ' || attempt FROM idem_complete('a-2', '{}', 200, 'a', attempt => 2)}),
	'succeeded 2', 'a: the current attempt completes');
ok_as('a', q{SELECT idem_claim('a-3', NULL, 'a', lease => '1 millisecond')});
sleep 0.01;
is(ok_as('a', q{SELECT outcome || ' ' || attempt FROM idem_claim('a-3', NULL, 'a')}), 'claimed 2',
	'a: an expired lease is taken over');
is(ok_as('a', q{
	BEGIN;
	SELECT outcome || ' ' || inserted FROM idem_claim('a-4', '{"r": 1}', 'a');
	SELECT outcome || ' ' || inserted FROM idem_claim('a-4', '{"r": 1}', 'a');
	SELECT state FROM idem_complete('a-4', '{"same": "transaction"}', 200, 'a');
	SELECT outcome || ' ' || response::text FROM idem_claim('a-4', '{"r": 1}', 'a');
	COMMIT;
}), "claimed true\nclaimed false\nsucceeded\nreplay {\"same\": \"transaction\"}",
	'a: re-entrant calls in one transaction');
is(ok_as('a', q{SELECT key || ' ' || state || ' ' || attempt FROM idem_lookup('a-2', 'a')}), 'a-2 succeeded 2',
	'a: lookup of its own key');

# a concurrent claim of a key being inserted waits for the inserter, as INSERT ... ON CONFLICT does
my $s1 = $node->background_psql('postgres', extra_params => [ '-U', 'tenant_a' ]);
$s1->query_safe(q{SET app.tenant = 'a'});
$s1->query_safe('BEGIN');
$s1->query_safe(q{SELECT idem_claim('a-wait', NULL, 'a')});
my $s2 = $node->background_psql('postgres', extra_params => [ '-U', 'tenant_a' ], on_error_stop => 0);
$s2->query_safe(q{SET app.tenant = 'a'});
$s2->query_until(qr/started/, qq{\\echo started\nSELECT outcome || ' ' || inserted FROM idem_claim('a-wait', NULL, 'a');\n});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_stat_activity
	WHERE usename = 'tenant_a' AND wait_event_type = 'Lock' AND query LIKE '%a-wait%'}),
	'a: a concurrent claim of the key waits for the inserting transaction');
$s1->query_safe('COMMIT');
my $waited = $s2->query_until(qr/\n/, '');
chomp $waited;
is($waited, 'in_progress false', 'a: ... and then sees the committed claim: in_progress');
# REPEATABLE READ: a committed key the snapshot cannot see -> 40001
$s2->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$s2->query_safe('SELECT 1');
ok_as('a', q{SELECT idem_claim('a-rr', NULL, 'a')});
my ($rr_out, $rr_failed) = $s2->query(q{SELECT idem_claim('a-rr', NULL, 'a')});
like($s2->{stderr}, qr/could not serialize access/, 'a: REPEATABLE READ, a committed key not in the snapshot -> 40001');
$s2->query('ROLLBACK');
$s1->quit;
$s2->quit;

# ---- tenant b: symmetric
is(ok_as('b', q{SELECT (idem_lookup('a-1', 'a') IS NULL)::text; SELECT count(*) FROM idem_keys WHERE scope = 'a';}),
	"true\n0", 'b: a\'s keys are invisible');
like(err_as('b', q{SELECT idem_complete('a-3', '{}', 200, 'a')}), qr/idempotency key "a-3" does not exist/,
	'b: complete of a\'s pending key -> IK003');
is(ok_as('b', q{SELECT outcome || ' ' || response::text FROM idem_claim('shared', '{"who": "b"}', 'b')}),
	'replay {"owner": "b"}', 'b: its own "shared" key replays its own response');
my $a_before = scope_sum('a');
is(ok_as('b', q{SELECT idem_reap()}), 1, 'b: idem_reap deletes b\'s expired key only');
is(scope_sum('a'), $a_before, 'a\'s rows are unchanged by b');

# ---- privileges on this path: reaping needs SELECT and UPDATE besides DELETE (docs/api.md)
sql(q{CREATE ROLE reaper_a LOGIN; GRANT DELETE ON idem_keys TO reaper_a;});
my ($rc, $out, $err) = $node->psql('postgres', q{SET app.tenant = 'a'; SELECT idem_reap()},
	extra_params => [ '-U', 'reaper_a' ]);
like($err, qr/permission denied for table idem_keys/, 'reaper with DELETE only, under RLS -> 42501');
sql(q{GRANT SELECT, UPDATE ON idem_keys TO reaper_a;});
($rc, $out, $err) = $node->psql('postgres', q{SET app.tenant = 'a'; SELECT idem_reap()},
	extra_params => [ '-U', 'reaper_a' ]);
is("$out$err", '0', 'reaper with SELECT, UPDATE and DELETE, under RLS: reaps');

# ---- a key that exists but that the policies hide (here: a RESTRICTIVE policy hides finished
# keys from the tenants): a claim whose insert conflicts with it is refused with 42501 naming only
# the key, never a replay or a takeover, and the hidden row is untouched
my $a_rows = scope_sum('a');
sql(q{CREATE POLICY hide_finished ON idem_keys AS RESTRICTIVE FOR SELECT USING (state = 'pending')});
is(ok_as('a', q{SELECT idem_lookup('a-1', 'a') IS NULL}), 't', 'a finished key hidden by a policy: lookup NULL');
like(err_as('a', q{SELECT * FROM idem_claim('a-1', '{"n": 1}', 'a')}),
	qr/ERROR:  idempotency key "a-1" exists but row-level security hides it from this role/,
	'a claim that conflicts with a key the policies hide -> 42501 (the extension\'s message)');
like(err_as('a', q{SELECT * FROM idem_complete('a-1', '{}', 200, 'a')}),
	qr/ERROR:  idempotency key "a-1" does not exist/, '... complete of it -> IK003');
is(scope_sum('a'), $a_rows, '... and the rows are unchanged');
sql(q{DROP POLICY hide_finished ON idem_keys});

# ---- what the policy does not do
# 1. the session chooses app.tenant
is((as_tenant('a', q{SELECT response::text FROM idem_lookup('b-done', 'b')}, 'b'))[0], '{"secret": "of b"}',
	'caveat: tenant_a with app.tenant = b reads b\'s keys: the setting is the client\'s (docs/security.md)');
sql(q{CREATE POLICY tenant_role ON idem_keys AS RESTRICTIVE
	USING (scope = CASE current_user WHEN 'tenant_a' THEN 'a' WHEN 'tenant_b' THEN 'b' END)});
is((as_tenant('a', q{SELECT idem_lookup('b-done', 'b') IS NULL}, 'b'))[0], 't',
	'a RESTRICTIVE policy bound to the role: app.tenant = b no longer gives tenant_a b\'s keys');
like((as_tenant('a', q{SELECT idem_claim('b-new', NULL, 'b')}, 'b'))[1], $rls_violation,
	'... nor lets it claim in b\'s scope');
is(ok_as('a', q{SELECT outcome FROM idem_claim('a-5', NULL, 'a')}), 'claimed', '... and a\'s own keys still work');
sql(q{DROP POLICY tenant_role ON idem_keys});
# 2. RESET app.tenant -> '' : the default scope
is(ok_as('a', q{RESET app.tenant; SELECT outcome FROM idem_claim('in-default-scope')}), 'claimed',
	'caveat: after RESET app.tenant the session is in the \'\' scope (docs/security.md)');
sql(q{CREATE POLICY no_empty_scope ON idem_keys AS RESTRICTIVE USING (scope <> '')});
like(err_as('a', q{RESET app.tenant; SELECT idem_claim('in-default-scope-2')}), $rls_violation,
	'a RESTRICTIVE policy scope <> \'\' closes it');
sql(q{DROP POLICY no_empty_scope ON idem_keys});
# 3. the policy's functions run with search_path = pg_catalog, pg_temp
sql(q{
	CREATE SCHEMA tenancy;
	CREATE TABLE tenancy.tenants (role name PRIMARY KEY, scope text NOT NULL);
	INSERT INTO tenancy.tenants VALUES ('tenant_a', 'a'), ('tenant_b', 'b');
	GRANT USAGE ON SCHEMA tenancy TO PUBLIC;
	GRANT SELECT ON tenancy.tenants TO PUBLIC;
	SET search_path = tenancy, public;
	CREATE FUNCTION tenancy.my_scope() RETURNS text LANGUAGE sql STABLE
		AS $$ SELECT scope FROM tenants WHERE role = current_user $$;
	CREATE POLICY by_table ON public.idem_keys AS RESTRICTIVE USING (scope = tenancy.my_scope());
	ALTER ROLE tenant_a SET search_path = tenancy, public;
});
is(ok_as('a', q{SELECT count(*) > 0 FROM idem_keys}), 't',
	'a policy function relying on the caller\'s search_path works in plain SQL...');
like(err_as('a', q{SELECT idem_lookup('a-1', 'a')}), qr/relation "tenants" does not exist/,
	'... but not inside the functions (search_path = pg_catalog, pg_temp): 42P01');
sql(q{ALTER FUNCTION tenancy.my_scope() SET search_path = tenancy});
is(ok_as('a', q{SELECT state FROM idem_lookup('a-1', 'a')}), 'succeeded',
	'with SET search_path on the policy function it works');
sql(q{DROP POLICY by_table ON idem_keys; ALTER ROLE tenant_a RESET search_path;});
# 4. a WITH CHECK violation is PostgreSQL's error: the statement (and a literal body) is logged
my $offset = -s $node->logfile;
err_as('a', q{SELECT idem_claim('b-x', '{"card": "SECRET-BODY-rls-check"}', 'b')});
like(slurp_file($node->logfile, $offset), qr/STATEMENT:  .*SECRET-BODY-rls-check/,
	'a WITH CHECK violation logs the statement after it, a literal body included (pass bodies as parameters)');
$offset = -s $node->logfile;
err_as('a', q{SELECT idem_complete('b-pending', '{"card": "SECRET-BODY-rls-hidden"}', 200, 'b')});
unlike(slurp_file($node->logfile, $offset), qr/SECRET-BODY-rls-hidden/,
	'IK003 for a hidden key is the extension\'s error: no statement, no body');

like(scope_sum('b'), qr/^4 /, 'b still has its 4 keys (b-done, b-pending, b-failed, shared)');
$node->stop;
done_testing();
