# pg_dump / pg_restore, DROP EXTENSION and ALTER EXTENSION UPDATE (issue 5, "Security").
#
# 1. A database with the extension in its own schema, keys in every state (odd scopes, given and
#    computed fingerprints, takeovers, a 1 MB response) and grants, dumped in custom format
#    (restored with pg_restore) and in plain format (restored with psql) into new databases: every
#    key is there with every column identical, the grants too, and the extension works on them
#    (replays of the stored responses, in_progress, takeovers, IK001 for another request, new keys,
#    the background reaper).  Row-level security on idem_keys (the flag and a policy) is restored
#    too (1.5: recorded in the extension's configuration tables; tenants across a restore in
#    044_rls_restore.pl).
# 2. DROP EXTENSION removes every object (nothing named idem_* left in pg_class, pg_type, pg_proc,
#    no dependency left), the schema it was created in stays, the background reaper leaves the
#    database without errors, and CREATE EXTENSION again works (and is reaped again).
# 3. Upgrades: for every older version installed next to the default one (discovered from
#    pg_available_extension_versions and cross-checked with sql/idempotency--*.sql), CREATE
#    EXTENSION VERSION 'old' with keys, ALTER EXTENSION UPDATE: the keys are kept, and the catalog
#    objects are those of a fresh install of the default version.  With one version only this is
#    skipped, saying so.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

my $node = PostgreSQL::Test::Cluster->new('dump');
$node->init(extra => [ '--encoding=UTF8', '--locale=C' ]);
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_naptime = 1s
max_worker_processes = 16
});
$node->start;

sub sql { my ($db, $sql) = @_; return $node->safe_psql($db, $sql); }

# Every row, every column, in text form; and the same as an md5 (identical server and TimeZone)
my $rows_sql = q{SELECT count(*) || ' ' || md5(string_agg(k::text, E'\n' ORDER BY scope, key)) FROM idem.idem_keys k};
my $rows_text = q{SELECT string_agg(k::text, E'\n' ORDER BY scope, key) FROM idem.idem_keys k WHERE key NOT LIKE 'bulk-%' AND key <> 'big'};

# ---- the source database
sql('postgres', 'CREATE DATABASE src');
sql('postgres', 'CREATE ROLE app LOGIN');
sql('postgres', 'CREATE ROLE auditor LOGIN');
sql('src', q{
	CREATE SCHEMA idem;
	CREATE EXTENSION idempotency SCHEMA idem;
	GRANT USAGE ON SCHEMA idem TO app, auditor;
	GRANT SELECT, INSERT, UPDATE ON idem.idem_keys TO app;
	GRANT SELECT ON idem.idem_keys TO auditor;
	SET search_path = idem;
	-- long ttls everywhere: the background reaper must not change the table during the test
	SELECT idem_claim('pending-live', '{"a": 1}', lease => '1 hour', ttl => '7 days');
	SELECT idem_claim('pending-expired', '{"a": 2}', lease => '1 millisecond', ttl => '7 days');
	SELECT idem_claim('succeeded', '{"a": 3, "b": [1, 2, {"c": null}]}', ttl => '7 days');
	SELECT idem_complete('succeeded', '{"ok": true, "id": 42, "unicode": "caf\u00e9 \ud83d\ude00"}', 201);
	SELECT idem_claim('failed-retry', '{"a": 4}', ttl => '7 days');
	SELECT idem_fail('failed-retry', '{"error": "timeout"}', 503, retryable => true);
	SELECT idem_claim('failed-final', '{"a": 5}', ttl => '7 days');
	SELECT idem_fail('failed-final', '{"error": "declined"}', 422, retryable => false);
	SELECT idem_claim('taken-over', '{"a": 6}', ttl => '7 days');
	SELECT idem_fail('taken-over', NULL, 500);
	SELECT idem_claim('taken-over', '{"a": 6}');
	SELECT idem_fail('taken-over', NULL, 500);
	SELECT idem_claim('taken-over', '{"a": 6}');
	SELECT idem_complete('taken-over', '"third time"', 200, attempt => 3);
	SELECT idem_claim('fp-given', fingerprint => '\xdeadbeef', ttl => '7 days');
	SELECT idem_complete('fp-given', '[]', 204);
	SELECT idem_claim('no-fp', ttl => '7 days');
	SELECT idem_claim('odd', '{"s": 1}', E'tab\there\nnewline', ttl => '7 days', lease => '1 hour');
	SELECT idem_claim('odd', '{"s": 2}', U&'\+01F600 caf\00E9', ttl => '7 days', lease => '1 hour');
	SELECT idem_claim('odd', '{"s": 3}', $$'); DROP TABLE x; --\\N$$, ttl => '7 days', lease => '1 hour');
	SELECT idem_complete('odd', '{"s": "done"}', 200, U&'\+01F600 caf\00E9');
	SELECT idem_claim('big', ttl => '7 days');
	SELECT idem_complete('big', jsonb_build_object('blob',
		(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 32768) g)));
	SELECT idem_claim('bulk-' || g, jsonb_build_object('n', g), 'bulk', ttl => '7 days') FROM generate_series(1, 2000) g;
	SELECT idem_complete('bulk-' || g, jsonb_build_object('r', g), 200, 'bulk') FROM generate_series(1, 2000, 2) g;
});
sleep 0.01;    # pending-expired's lease is over
my $src_rows = sql('src', $rows_sql);
my $src_text = sql('src', $rows_text);
like($src_rows, qr/^2012 /, 'source: 2012 keys');

# Row-level security on idem_keys, to see what the dump does with it
sql('src', q{
	ALTER TABLE idem.idem_keys ENABLE ROW LEVEL SECURITY;
	CREATE POLICY tenant ON idem.idem_keys USING (scope = current_setting('app.tenant', true))
		WITH CHECK (scope = current_setting('app.tenant', true));
});

my $tmp = PostgreSQL::Test::Utils::tempdir;
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$tmp/src.dump", '-d', $node->connstr('src') ],
	'pg_dump -Fc');
$node->command_ok([ 'pg_dump', '-Fp', '-f', "$tmp/src.sql", '-d', $node->connstr('src') ],
	'pg_dump -Fp');
is(sql('src', $rows_sql), $src_rows, 'source unchanged by the dumps');

sql('postgres', 'CREATE DATABASE dst');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('dst'), "$tmp/src.dump" ],
	'pg_restore into a new database');
sql('postgres', 'CREATE DATABASE dst_plain');
$node->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('dst_plain'),
	'-f', "$tmp/src.sql" ], 'plain dump restored with psql');

for my $db (qw(dst dst_plain))
{
	is(sql($db, $rows_sql), $src_rows, "$db: every key, every column identical (md5 of all rows)");
	is(sql($db, $rows_text), $src_text, "$db: the keys other than bulk and big, row by row");
	is(sql($db, q{SELECT extversion || ' ' || extnamespace::regnamespace FROM pg_extension WHERE extname = 'idempotency'}),
		sql('src', q{SELECT extversion || ' ' || extnamespace::regnamespace FROM pg_extension WHERE extname = 'idempotency'}),
		"$db: same extension version, same schema");
	is(sql($db, q{SELECT array_to_string(extconfig::regclass[], ',') FROM pg_extension WHERE extname = 'idempotency'}),
		'idem.idem_keys,idem.idem_row_security,idem.idem_policies', "$db: idem_keys and the row-level security record are still registered for pg_dump");
	is(sql($db, q{SELECT has_table_privilege('app', 'idem.idem_keys', 'SELECT, INSERT, UPDATE')::text
		|| has_table_privilege('app', 'idem.idem_keys', 'DELETE')::text
		|| has_table_privilege('auditor', 'idem.idem_keys', 'SELECT')::text
		|| has_table_privilege('auditor', 'idem.idem_keys', 'INSERT')::text
		|| (SELECT count(*) FROM aclexplode((SELECT relacl FROM pg_class WHERE oid = 'idem.idem_keys'::regclass)) WHERE grantee = 0)}),
		'truefalsetruefalse0', "$db: grants kept, PUBLIC still has nothing");
	is(sql($db, q{SELECT relrowsecurity::text || ' ' || (SELECT count(*) FROM pg_policy WHERE polrelid = 'idem.idem_keys'::regclass)
		FROM pg_class WHERE oid = 'idem.idem_keys'::regclass}),
		'true 1', "$db: row-level security and the policy on idem_keys are restored");

	# the extension works on the restored keys
	my $r = sql($db, q{
		SET search_path = idem;
		SELECT outcome || ' ' || response_code || ' ' || response::text FROM idem_claim('succeeded', '{"b": [1, 2, {"c": null}], "a": 3}');
		SELECT outcome || ' ' || attempt || ' ' || (retry_after > '0') FROM idem_claim('pending-live', '{"a": 1}');
		SELECT outcome || ' ' || inserted || ' ' || attempt FROM idem_claim('pending-expired', '{"a": 2}');
		SELECT outcome || ' ' || attempt FROM idem_claim('failed-retry', '{"a": 4}');
		SELECT outcome || ' ' || response_code || ' ' || response::text FROM idem_claim('failed-final', '{"a": 5}');
		SELECT outcome || ' ' || attempt || ' ' || response::text FROM idem_claim('taken-over', '{"a": 6}');
		SELECT outcome || ' ' || response_code FROM idem_claim('fp-given', fingerprint => '\xdeadbeef');
		SELECT outcome || ' ' || response::text FROM idem_claim('odd', '{"s": 2}', U&'\+01F600 caf\00E9');
		SELECT outcome FROM idem_claim('odd', '{"s": 1}', E'tab\there\nnewline');
		SELECT md5(response::text) = (SELECT md5(jsonb_build_object('blob', string_agg(md5(g::text), ''))::text)
		                              FROM generate_series(1, 32768) g) FROM idem_claim('big');
		SELECT state || ' ' || attempt FROM idem_complete('pending-live', '{"late": "but fine"}', attempt => 1);
		SELECT outcome || ' ' || inserted FROM idem_claim('new-key', '{"n": 1}');
		SELECT count(*) FROM idem_keys WHERE scope = 'bulk' AND state = 'succeeded';
	});
	is($r, join("\n",
		'replay 201 {"id": 42, "ok": true, "unicode": "café 😀"}',
		'in_progress 1 true',
		'claimed false 2',
		'claimed 2',
		'replay 422 {"error": "declined"}',
		'replay 3 "third time"',
		'replay 204',
		'replay {"s": "done"}',
		'in_progress',
		't',
		'succeeded 1',
		'claimed true',
		'1000'), "$db: replays, in_progress, takeovers, fencing state and new keys work on restored keys");
	my ($rc, $out, $err) = $node->psql($db, q{SELECT idem.idem_claim('fp-given', fingerprint => '\xdeadbeee')});
	like($err, qr/idempotency key "fp-given" was already used with a different request/,
		"$db: the stored fingerprint still tells a different request (IK001)");
	($rc, $out, $err) = $node->psql($db, q{SELECT idem.idem_claim('succeeded', '{"a": 3}')});
	like($err, qr/already used with a different request/, "$db: ... and so does the stored request fingerprint");
	# the roles' privileges work
	is($node->safe_psql($db, q{SET app.tenant = ''; SELECT outcome FROM idem.idem_claim('by-app', '{}')}, extra_params => [ '-U', 'app' ]),
		'claimed', "$db: the app role claims with the restored grants, within the restored policy");
	($rc, $out, $err) = $node->psql($db, q{SET app.tenant = 'other'; SELECT idem.idem_claim('by-app-2', '{}')}, extra_params => [ '-U', 'app' ]);
	like($err, qr/violates row-level security policy/, "$db: ... and the restored policy confines it");
	($rc, $out, $err) = $node->psql($db, q{SELECT idem.idem_claim('by-auditor')}, extra_params => [ '-U', 'auditor' ]);
	like($err, qr/permission denied for table idem_keys/, "$db: the read-only role still cannot claim");
	# the background reaper serves the restored database
	sql($db, q{SELECT idem.idem_claim('expire-me', ttl => '1 millisecond', lease => '1 millisecond')});
	ok($node->poll_query_until($db, q{SELECT count(*) = 0 FROM idem.idem_keys WHERE key = 'expire-me'}),
		"$db: the background reaper reaps the restored database");
	is(sql($db, q{SELECT count(*) FROM idem.idem_keys WHERE scope = 'bulk'}), 2000, "$db: and only expired keys");
}

# ---- 2. DROP EXTENSION
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency reaper' AND datname = 'dst'}),
	'dst has its reaper');
my $log_offset = -s $node->logfile;
sql('dst', 'DROP EXTENSION idempotency');
my $leftovers = sql('dst', q{
	SELECT string_agg(what, ', ' ORDER BY what) FROM (
		SELECT 'pg_class ' || relname AS what FROM pg_class WHERE relname LIKE 'idem\_%'
		UNION ALL SELECT 'pg_type ' || typname FROM pg_type WHERE typname LIKE 'idem\_%' OR typname LIKE '\_idem\_%'
		UNION ALL SELECT 'pg_proc ' || proname FROM pg_proc WHERE proname LIKE 'idem\_%'
		UNION ALL SELECT 'pg_class in idem ' || relname FROM pg_class WHERE relnamespace = 'idem'::regnamespace
		UNION ALL SELECT 'pg_proc in idem ' || proname FROM pg_proc WHERE pronamespace = 'idem'::regnamespace
		UNION ALL SELECT 'pg_type in idem ' || typname FROM pg_type WHERE typnamespace = 'idem'::regnamespace
		UNION ALL SELECT 'pg_event_trigger ' || evtname FROM pg_event_trigger WHERE evtname LIKE 'idem\_%'
		UNION ALL SELECT 'pg_extension' FROM pg_extension WHERE extname = 'idempotency'
		UNION ALL SELECT 'pg_depend ' || pg_describe_object(classid, objid, objsubid) FROM pg_depend
			WHERE refclassid = 'pg_extension'::regclass AND refobjid NOT IN (SELECT oid FROM pg_extension)
		UNION ALL SELECT 'pg_init_privs ' || objoid FROM pg_init_privs WHERE classoid = 'pg_class'::regclass
			AND objoid NOT IN (SELECT oid FROM pg_class)
	) s});
is($leftovers, '', 'DROP EXTENSION: no idem_* object, dependency or initial privilege left');
is(sql('dst', q{SELECT count(*) FROM pg_namespace WHERE nspname = 'idem'}), 1,
	'DROP EXTENSION: the schema it was created in (by the user) stays');
is(sql('dst', q{SELECT count(*) FROM pg_policy}), 0, 'no policy left');
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'idempotency reaper' AND datname = 'dst'}),
	'DROP EXTENSION: the reaper leaves the database');
sleep 2.5;    # more than two naptimes
is(sql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency reaper' AND datname = 'dst'}),
	0, '... and does not come back while the extension is gone');
my $log = slurp_file($node->logfile, $log_offset);
unlike($log, qr/(ERROR|FATAL|PANIC|WARNING).*/, 'no error, warning or crash in the server log after DROP EXTENSION')
  or diag $log;
# and again
sql('dst', 'CREATE EXTENSION idempotency SCHEMA idem');
is(sql('dst', q{SELECT count(*) FROM idem.idem_keys}), 0, 'CREATE EXTENSION again: an empty table');
sql('dst', q{SELECT idem.idem_claim('expire-me', ttl => '1 millisecond', lease => '1 millisecond')});
ok($node->poll_query_until('dst', q{SELECT count(*) = 0 FROM idem.idem_keys WHERE key = 'expire-me'}),
	'... and the reaper serves the database again');

# ---- 3. upgrades from every older version
my $default = sql('postgres', q{SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'});
my @installed = split /\n/, sql('postgres',
	q{SELECT version FROM pg_available_extension_versions WHERE name = 'idempotency' ORDER BY string_to_array(version, '.')::int[]});
my $srcdir = $ENV{TESTDIR} // '.';
my %in_tree;
for my $f (glob("$srcdir/sql/idempotency--*.sql"))
{
	my ($from, $to) = $f =~ m{idempotency--([^-/]+?)(?:--([^-/]+?))?\.sql$} or next;
	$in_tree{$to // $from} = 1;
	$in_tree{$from} = 1 if defined $to;
}
# (a version reachable only by update scripts counts: CREATE EXTENSION VERSION can go through them)
is_deeply(\@installed, [ sort { version_cmp($a, $b) } keys %in_tree ],
	"the installed versions (@installed) are the tree's (sql/idempotency--*.sql)");
my @older = grep { version_cmp($_, $default) < 0 } @installed;

sub version_cmp
{
	my @a = split /\./, $_[0];
	my @b = split /\./, $_[1];
	while (@a || @b)
	{
		my $c = (shift(@a) // 0) <=> (shift(@b) // 0);
		return $c if $c;
	}
	return 0;
}

# The extension's objects in a comparable form: members, routines (with their definitions,
# properties and ACLs), columns (in order), relations (options, ACLs), indexes, constraints, enum
# labels (in order), composite types, views and pg_dump registration.
my $catalog_sql = q{
WITH ext AS (SELECT oid, extnamespace, extconfig, extcondition FROM pg_extension WHERE extname = 'idempotency'),
members AS (SELECT d.classid, d.objid, d.objsubid FROM pg_depend d, ext
            WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'),
rels AS (SELECT c.* FROM pg_class c JOIN members m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid)
SELECT string_agg(line, E'\n' ORDER BY line) FROM (
  SELECT 'member ' || pg_describe_object(classid, objid, objsubid) AS line FROM members
  UNION ALL
  SELECT 'routine ' || p.oid::regprocedure || ' ' || md5(pg_get_functiondef(p.oid)) || ' '
         || p.provolatile::text || p.proisstrict::text || p.prosecdef::text || p.proparallel::text || ' '
         || coalesce(array_to_string(p.proconfig, ','), '-') || ' acl=' || coalesce(p.proacl::text, 'default')
  FROM pg_proc p JOIN members m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid
  UNION ALL
  SELECT 'column ' || c.relname || ' ' || row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum) || ' '
         || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' notnull=' || a.attnotnull::text
         || ' collation=' || coalesce(co.collname, '-') || ' default=' || coalesce(pg_get_expr(ad.adbin, ad.adrelid), '-')
  FROM rels c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef ad ON ad.adrelid = c.oid AND ad.adnum = a.attnum
  LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0
  UNION ALL
  SELECT 'relation ' || relname || ' kind=' || relkind::text || ' options=' || coalesce(array_to_string(reloptions, ','), '-')
         || ' acl=' || coalesce(relacl::text, 'default') || ' rls=' || relrowsecurity::text || relforcerowsecurity::text
  FROM rels
  UNION ALL
  SELECT 'index ' || pg_get_indexdef(i.indexrelid) || ' options=' || coalesce(array_to_string(ic.reloptions, ','), '-')
  FROM pg_index i JOIN rels r ON r.oid = i.indrelid JOIN pg_class ic ON ic.oid = i.indexrelid
  UNION ALL
  SELECT 'constraint ' || r.relname || ' ' || conname || ' ' || pg_get_constraintdef(co.oid)
  FROM pg_constraint co JOIN rels r ON r.oid = co.conrelid
  UNION ALL
  SELECT 'trigger ' || r.relname || ' ' || pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN rels r ON r.oid = t.tgrelid
  UNION ALL
  SELECT 'enum ' || t.typname || ' ' || string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
  FROM pg_type t JOIN members m ON m.classid = 'pg_type'::regclass AND m.objid = t.oid
  JOIN pg_enum e ON e.enumtypid = t.oid GROUP BY t.typname
  UNION ALL
  SELECT 'composite ' || t.typname || ' ' || string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
  FROM pg_type t JOIN members m ON m.classid = 'pg_type'::regclass AND m.objid = t.oid
  JOIN pg_attribute a ON a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
  WHERE t.typtype = 'c' GROUP BY t.typname
  UNION ALL
  SELECT 'view ' || relname || ' ' || md5(pg_get_viewdef(oid)) FROM rels WHERE relkind = 'v'
  UNION ALL
  SELECT 'config ' || coalesce(array_to_string(extconfig::regclass[], ','), '-') || ' '
         || coalesce(array_to_string(extcondition, ','), '-') FROM ext
) s};

SKIP:
{
	skip "only one version of idempotency ($default) exists: no upgrade path to test", 1
	  unless @older;

	sql('postgres', 'CREATE DATABASE fresh');
	sql('fresh', 'CREATE EXTENSION idempotency');
	my $fresh = sql('fresh', $catalog_sql);
	for my $old (@older)
	{
		(my $db = "upgrade_$old") =~ s/\W/_/g;
		sql('postgres', "CREATE DATABASE $db");
		sql($db, "CREATE EXTENSION idempotency VERSION '$old'");
		is(sql($db, q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}), $old,
			"$old: installed");
		# keys made by the old version's functions
		sql($db, q{
			SELECT idem_claim('u-pending', '{"u": 1}', lease => '1 hour', ttl => '7 days');
			SELECT idem_claim('u-done', '{"u": 2}', ttl => '7 days');
			SELECT idem_complete('u-done', '{"done": true}', 201);
			SELECT idem_claim('u-failed', '{"u": 3}', ttl => '7 days');
			SELECT idem_fail('u-failed', '{"error": "x"}', 422, retryable => false);
		});
		my $before = sql($db, q{SELECT string_agg(scope || '|' || key || '|' || state || '|' || attempt || '|'
			|| coalesce(encode(fingerprint, 'hex'), '-') || '|' || coalesce(response::text, '-') || '|'
			|| coalesce(response_code::text, '-') || '|' || coalesce(retryable::text, '-') || '|' || created_at
			|| '|' || coalesce(locked_until::text, '-') || '|' || coalesce(completed_at::text, '-') || '|' || expires_at,
			E'\n' ORDER BY scope, key) FROM idem_keys});
		my $path = sql($db, qq{SELECT path FROM pg_extension_update_paths('idempotency')
			WHERE source = '$old' AND target = '$default'});
		isnt($path, '', "$old: an update path to $default exists ($path)");
		sql($db, 'ALTER EXTENSION idempotency UPDATE');
		is(sql($db, q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}), $default,
			"$old: ALTER EXTENSION UPDATE reaches $default");
		is(sql($db, $catalog_sql), $fresh, "$old -> $default: the catalog objects are those of a fresh install")
		  or diag "fresh:\n$fresh\n\nupdated:\n" . sql($db, $catalog_sql);
		is(sql($db, q{SELECT string_agg(scope || '|' || key || '|' || state || '|' || attempt || '|'
			|| coalesce(encode(fingerprint, 'hex'), '-') || '|' || coalesce(response::text, '-') || '|'
			|| coalesce(response_code::text, '-') || '|' || coalesce(retryable::text, '-') || '|' || created_at
			|| '|' || coalesce(locked_until::text, '-') || '|' || coalesce(completed_at::text, '-') || '|' || expires_at,
			E'\n' ORDER BY scope, key) FROM idem_keys}), $before, "$old -> $default: every key kept");
		is(sql($db, q{
			SELECT outcome || ' ' || response_code FROM idem_claim('u-done', '{"u": 2}');
			SELECT outcome FROM idem_claim('u-pending', '{"u": 1}');
			SELECT outcome || ' ' || response_code FROM idem_claim('u-failed', '{"u": 3}');
			SELECT state FROM idem_complete('u-pending', '{}', attempt => 1);
			SELECT outcome || ' ' || inserted FROM idem_claim('u-new');
		}), "replay 201\nin_progress\nreplay 422\nsucceeded\nclaimed true", "$old -> $default: the functions work on the kept keys");
		my ($rc, $out, $err) = $node->psql($db, q{SELECT idem_claim('u-done', '{"u": 3}')});
		like($err, qr/already used with a different request/, "$old -> $default: fingerprints still compare");
	}
}

$node->stop;
done_testing();
