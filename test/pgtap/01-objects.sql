-- idempotency: the extension's objects (docs/contract.md §1).
-- Run with pg_prove in a database where CREATE EXTENSION pgtap and
-- CREATE EXTENSION idempotency were done beforehand.
BEGIN;
SELECT plan(82);

-- The extension itself
SELECT has_extension('idempotency', 'extension idempotency is installed');
SELECT is((SELECT extversion FROM pg_extension WHERE extname = 'idempotency'),
          '1.6', 'installed version is 1.6');
SELECT is((SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'),
          '1.6', 'default version is 1.6');
SELECT is((SELECT extrelocatable FROM pg_extension WHERE extname = 'idempotency'),
          false, 'extension is not relocatable');
SELECT ok((SELECT 'idem_keys'::regclass = ANY (extconfig)
             FROM pg_extension WHERE extname = 'idempotency'),
          'idem_keys is registered with pg_extension_config_dump');
SELECT is((SELECT extcondition[array_position(extconfig, 'idem_keys'::regclass)]
             FROM pg_extension WHERE extname = 'idempotency'),
          '', 'pg_dump keeps every row of idem_keys (no filter condition)');
SELECT is((SELECT relnamespace FROM pg_class WHERE oid = 'idem_keys'::regclass),
          (SELECT extnamespace FROM pg_extension WHERE extname = 'idempotency'),
          'idem_keys lives in the extension schema');
SELECT set_eq(
    $$SELECT classid::regclass::text, objid
        FROM pg_depend
       WHERE refclassid = 'pg_extension'::regclass
         AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
         AND deptype = 'e'
         AND (classid, objid) IN (
             ('pg_type'::regclass, 'idem_state'::regtype),
             ('pg_type'::regclass, 'idem_outcome'::regtype),
             ('pg_type'::regclass, 'idem_claim_result'::regtype),
             ('pg_class'::regclass, 'idem_keys'::regclass),
             ('pg_proc'::regclass, 'idem_claim(text,jsonb,text,interval,interval,bytea,interval)'::regprocedure),
             ('pg_proc'::regclass, 'idem_complete(text,jsonb,integer,text,integer,interval,bytea,jsonb)'::regprocedure),
             ('pg_proc'::regclass, 'idem_fail(text,jsonb,integer,boolean,text,integer,interval,bytea,jsonb)'::regprocedure),
             ('pg_proc'::regclass, 'idem_lookup(text,text)'::regprocedure),
             ('pg_proc'::regclass, 'idem_reap(integer)'::regprocedure),
             ('pg_proc'::regclass, 'idem_reap_all(integer,bigint)'::regprocedure))$$,
    $$VALUES ('pg_type', 'idem_state'::regtype::oid),
             ('pg_type', 'idem_outcome'::regtype::oid),
             ('pg_type', 'idem_claim_result'::regtype::oid),
             ('pg_class', 'idem_keys'::regclass::oid),
             ('pg_proc', 'idem_claim(text,jsonb,text,interval,interval,bytea,interval)'::regprocedure::oid),
             ('pg_proc', 'idem_complete(text,jsonb,integer,text,integer,interval,bytea,jsonb)'::regprocedure::oid),
             ('pg_proc', 'idem_fail(text,jsonb,integer,boolean,text,integer,interval,bytea,jsonb)'::regprocedure::oid),
             ('pg_proc', 'idem_lookup(text,text)'::regprocedure::oid),
             ('pg_proc', 'idem_reap(integer)'::regprocedure::oid),
             ('pg_proc', 'idem_reap_all(integer,bigint)'::regprocedure::oid)$$,
    'every 1.0 object is a member of the extension');

-- 1.5: row-level security recorded for dumps (docs/security.md)
SELECT ok((SELECT ARRAY['idem_row_security'::regclass::oid, 'idem_policies'::regclass::oid] <@ extconfig
             FROM pg_extension WHERE extname = 'idempotency'),
          'idem_row_security and idem_policies are registered with pg_extension_config_dump');
SELECT set_eq(
    $$SELECT evtname::text || ' ' || evtevent FROM pg_event_trigger e
        JOIN pg_depend d ON d.classid = 'pg_event_trigger'::regclass AND d.objid = e.oid AND d.deptype = 'e'
        JOIN pg_extension x ON x.oid = d.refobjid AND x.extname = 'idempotency'$$,
    $$VALUES ('idem_row_security_ddl ddl_command_end'), ('idem_row_security_drop sql_drop')$$,
    'the event triggers that record idem_keys'' row-level security are members of the extension');
SELECT is((SELECT count(*)::int FROM pg_class c, aclexplode(c.relacl) a
            WHERE c.oid IN ('idem_row_security'::regclass, 'idem_policies'::regclass) AND a.grantee = 0),
          0, 'PUBLIC has no privilege on the row-level security record');
SELECT set_eq(
    $$SELECT tgname::text FROM pg_trigger WHERE tgrelid IN ('idem_row_security'::regclass, 'idem_policies'::regclass)$$,
    $$VALUES ('idem_row_security_restore'), ('idem_policies_restore')$$,
    'loading the record (a restore) applies it');
-- 1.6: nothing runs with the extension owner's rights (docs/security.md "The model")
SELECT is((SELECT string_agg(p.proname, ',') FROM pg_proc p
             JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
             JOIN pg_extension x ON x.oid = d.refobjid AND x.extname = 'idempotency'
            WHERE p.prosecdef), NULL, 'no routine of the extension is SECURITY DEFINER');
SELECT is((SELECT string_agg(c.relname || ' ' || pg_get_userbyid(c.relowner), ',' ORDER BY c.relname) FROM pg_class c
            WHERE c.oid IN ('idem_row_security'::regclass, 'idem_policies'::regclass)
              AND c.relowner <> (SELECT relowner FROM pg_class WHERE oid = 'idem_keys'::regclass)),
          NULL, 'the record belongs to the owner of idem_keys');

-- Enums, labels in order
SELECT has_enum('idem_state');
SELECT enum_has_labels('idem_state', ARRAY['pending', 'succeeded', 'failed']);
SELECT has_enum('idem_outcome');
SELECT enum_has_labels('idem_outcome', ARRAY['claimed', 'replay', 'in_progress']);

-- Composite idem_claim_result
SELECT has_composite('idem_claim_result');
SELECT has_column('idem_claim_result', 'outcome',       'idem_claim_result has outcome');
SELECT col_type_is('idem_claim_result', 'outcome',       'idem_outcome', 'idem_claim_result.outcome is idem_outcome');
SELECT has_column('idem_claim_result', 'inserted',      'idem_claim_result has inserted');
SELECT col_type_is('idem_claim_result', 'inserted',      'boolean', 'idem_claim_result.inserted is boolean');
SELECT has_column('idem_claim_result', 'attempt',       'idem_claim_result has attempt');
SELECT col_type_is('idem_claim_result', 'attempt',       'integer', 'idem_claim_result.attempt is integer');
SELECT has_column('idem_claim_result', 'state',         'idem_claim_result has state');
SELECT col_type_is('idem_claim_result', 'state',         'idem_state', 'idem_claim_result.state is idem_state');
SELECT has_column('idem_claim_result', 'response',      'idem_claim_result has response');
SELECT col_type_is('idem_claim_result', 'response',      'jsonb', 'idem_claim_result.response is jsonb');
SELECT has_column('idem_claim_result', 'response_code', 'idem_claim_result has response_code');
SELECT col_type_is('idem_claim_result', 'response_code', 'integer', 'idem_claim_result.response_code is integer');
SELECT has_column('idem_claim_result', 'retry_after',   'idem_claim_result has retry_after');
SELECT col_type_is('idem_claim_result', 'retry_after',   'interval', 'idem_claim_result.retry_after is interval');
SELECT has_column('idem_claim_result', 'expires_at',    'idem_claim_result has expires_at');
SELECT col_type_is('idem_claim_result', 'expires_at',    'timestamp with time zone', 'idem_claim_result.expires_at is timestamptz');
SELECT is(
    ARRAY(SELECT attname::text FROM pg_attribute
           WHERE attrelid = (SELECT typrelid FROM pg_type WHERE oid = 'idem_claim_result'::regtype)
             AND attnum > 0 AND NOT attisdropped ORDER BY attnum),
    ARRAY['outcome', 'inserted', 'attempt', 'state', 'response', 'response_code',
          'retry_after', 'expires_at', 'retry_after_s', 'response_body', 'response_headers'],
    'idem_claim_result has exactly these fields, in this order (1.2''s appended)');

-- Table idem_keys
SELECT has_table('idem_keys');
SELECT has_column('idem_keys', 'scope',         'idem_keys has scope');
SELECT col_type_is('idem_keys', 'scope',         'text', 'idem_keys.scope is text');
SELECT has_column('idem_keys', 'key',           'idem_keys has key');
SELECT col_type_is('idem_keys', 'key',           'text', 'idem_keys.key is text');
SELECT has_column('idem_keys', 'state',         'idem_keys has state');
SELECT col_type_is('idem_keys', 'state',         'idem_state', 'idem_keys.state is idem_state');
SELECT has_column('idem_keys', 'attempt',       'idem_keys has attempt');
SELECT col_type_is('idem_keys', 'attempt',       'integer', 'idem_keys.attempt is integer');
SELECT has_column('idem_keys', 'fingerprint',   'idem_keys has fingerprint');
SELECT col_type_is('idem_keys', 'fingerprint',   'bytea', 'idem_keys.fingerprint is bytea');
SELECT has_column('idem_keys', 'response',      'idem_keys has response');
SELECT col_type_is('idem_keys', 'response',      'jsonb', 'idem_keys.response is jsonb');
SELECT has_column('idem_keys', 'response_code', 'idem_keys has response_code');
SELECT col_type_is('idem_keys', 'response_code', 'integer', 'idem_keys.response_code is integer');
SELECT has_column('idem_keys', 'retryable',     'idem_keys has retryable');
SELECT col_type_is('idem_keys', 'retryable',     'boolean', 'idem_keys.retryable is boolean');
SELECT has_column('idem_keys', 'created_at',    'idem_keys has created_at');
SELECT col_type_is('idem_keys', 'created_at',    'timestamp with time zone', 'idem_keys.created_at is timestamptz');
SELECT has_column('idem_keys', 'locked_until',  'idem_keys has locked_until');
SELECT col_type_is('idem_keys', 'locked_until',  'timestamp with time zone', 'idem_keys.locked_until is timestamptz');
SELECT has_column('idem_keys', 'completed_at',  'idem_keys has completed_at');
SELECT col_type_is('idem_keys', 'completed_at',  'timestamp with time zone', 'idem_keys.completed_at is timestamptz');
SELECT has_column('idem_keys', 'expires_at',    'idem_keys has expires_at');
SELECT col_type_is('idem_keys', 'expires_at',    'timestamp with time zone', 'idem_keys.expires_at is timestamptz');
SELECT is(
    ARRAY(SELECT attname::text FROM pg_attribute
           WHERE attrelid = 'idem_keys'::regclass AND attnum > 0 AND NOT attisdropped
           ORDER BY attnum LIMIT 12),
    ARRAY['scope', 'key', 'state', 'attempt', 'fingerprint', 'response', 'response_code',
          'retryable', 'created_at', 'locked_until', 'completed_at', 'expires_at'],
    'the contract''s twelve columns come first, in this order');
SELECT is(
    ARRAY(SELECT attname::text || ' ' || format_type(atttypid, atttypmod) FROM pg_attribute
           WHERE attrelid = 'idem_keys'::regclass AND attnum > 12 AND NOT attisdropped
           ORDER BY attnum),
    ARRAY['response_body bytea', 'response_headers jsonb', 'claimed_at timestamp with time zone'],
    '1.2''s columns follow them');
SELECT col_not_null('idem_keys', 'scope', 'idem_keys.scope is NOT NULL');
SELECT col_not_null('idem_keys', 'key', 'idem_keys.key is NOT NULL');
SELECT col_default_is('idem_keys', 'scope', ''::text, 'idem_keys.scope defaults to ''''');
SELECT is((SELECT c.collname::text FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
            WHERE a.attrelid = 'idem_keys'::regclass AND a.attname = 'scope'),
          'C', 'idem_keys.scope uses the "C" collation');
SELECT is((SELECT c.collname::text FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
            WHERE a.attrelid = 'idem_keys'::regclass AND a.attname = 'key'),
          'C', 'idem_keys.key uses the "C" collation');

-- Primary key and indexes
SELECT has_pk('idem_keys');
SELECT col_is_pk('idem_keys', ARRAY['scope', 'key'], 'the primary key of idem_keys is (scope, key)');
SELECT has_index('idem_keys', 'idem_keys_pkey', ARRAY['scope', 'key'], 'index idem_keys_pkey is on (scope, key)');
SELECT index_is_primary('idem_keys', 'idem_keys_pkey');
SELECT index_is_unique('idem_keys', 'idem_keys_pkey');
SELECT has_index('idem_keys', 'idem_keys_expires_at_idx', 'expires_at', 'index idem_keys_expires_at_idx is on (expires_at)');
SELECT index_is_type('idem_keys', 'idem_keys_pkey', 'btree');
SELECT is((SELECT reloptions FROM pg_class WHERE oid = 'idem_keys_expires_at_idx'::regclass),
          ARRAY['pages_per_range=32', 'autosummarize=off'],
          'the BRIN index does not ask autovacuum to summarize (the reaper does)');
SELECT index_is_type('idem_keys', 'idem_keys_expires_at_idx', 'brin');

-- Row-level security is off by default (enabling it is supported: 03-privileges)
SELECT is((SELECT relrowsecurity FROM pg_class WHERE oid = 'idem_keys'::regclass),
          false, 'row-level security is not enabled on idem_keys');

-- Each routine has one overload (the update to 1.2 replaced the ones whose arguments changed)
SELECT is((SELECT count(*)::int FROM pg_proc
            WHERE pronamespace = (SELECT extnamespace FROM pg_extension WHERE extname = 'idempotency')
              AND proname IN ('idem_claim', 'idem_complete', 'idem_fail', 'idem_lookup',
                              'idem_reap', 'idem_reap_all', 'idem_extend', 'idem_release',
                              'idem_forget')),
          9, 'each routine has exactly one overload');

-- View idem_stalled (1.2)
SELECT has_view('idem_stalled');
SELECT is(
    ARRAY(SELECT attname::text || ' ' || format_type(atttypid, atttypmod) FROM pg_attribute
           WHERE attrelid = 'idem_stalled'::regclass AND attnum > 0 ORDER BY attnum),
    ARRAY['scope text', 'key text', 'attempt integer', 'locked_until timestamp with time zone',
          'created_at timestamp with time zone', 'stalled_for interval'],
    'idem_stalled has these columns, in this order');
SELECT is((SELECT reloptions FROM pg_class WHERE oid = 'idem_stalled'::regclass),
          ARRAY['security_invoker=true'],
          'idem_stalled runs with the privileges and policies of its caller');

SELECT * FROM finish();
ROLLBACK;
