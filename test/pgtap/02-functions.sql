-- idempotency: function signatures and properties (docs/contract.md §2).
-- All routines are VOLATILE, none is STRICT, none is SECURITY DEFINER.
BEGIN;
SELECT plan(58);

-- idem_claim
SELECT has_function('idem_claim', ARRAY['text', 'jsonb', 'text', 'interval', 'interval', 'bytea', 'interval']);
SELECT function_returns('idem_claim', ARRAY['text', 'jsonb', 'text', 'interval', 'interval', 'bytea', 'interval'], 'idem_claim_result');
SELECT is(pg_get_function_arguments('idem_claim(text,jsonb,text,interval,interval,bytea,interval)'::regprocedure),
          'key text, request jsonb DEFAULT NULL::jsonb, scope text DEFAULT ''''::text, '
          'ttl interval DEFAULT NULL::interval, lease interval DEFAULT NULL::interval, '
          'fingerprint bytea DEFAULT NULL::bytea, wait interval DEFAULT NULL::interval',
          'idem_claim argument names and defaults');
SELECT volatility_is('idem_claim', ARRAY['text', 'jsonb', 'text', 'interval', 'interval', 'bytea', 'interval'], 'volatile');
SELECT isnt_strict('idem_claim', ARRAY['text', 'jsonb', 'text', 'interval', 'interval', 'bytea', 'interval']);
SELECT isnt_definer('idem_claim', ARRAY['text', 'jsonb', 'text', 'interval', 'interval', 'bytea', 'interval']);
SELECT function_lang_is('idem_claim', ARRAY['text', 'jsonb', 'text', 'interval', 'interval', 'bytea', 'interval'], 'c');

-- idem_complete
SELECT has_function('idem_complete', ARRAY['text', 'jsonb', 'integer', 'text', 'integer', 'interval', 'bytea', 'jsonb']);
SELECT function_returns('idem_complete', ARRAY['text', 'jsonb', 'integer', 'text', 'integer', 'interval', 'bytea', 'jsonb'], 'idem_keys');
SELECT is(pg_get_function_arguments('idem_complete(text,jsonb,integer,text,integer,interval,bytea,jsonb)'::regprocedure),
          'key text, response jsonb, response_code integer DEFAULT 200, scope text DEFAULT ''''::text, '
          'attempt integer DEFAULT NULL::integer, ttl interval DEFAULT NULL::interval, '
          'body bytea DEFAULT NULL::bytea, headers jsonb DEFAULT NULL::jsonb',
          'idem_complete argument names and defaults');
SELECT volatility_is('idem_complete', ARRAY['text', 'jsonb', 'integer', 'text', 'integer', 'interval', 'bytea', 'jsonb'], 'volatile');
SELECT isnt_strict('idem_complete', ARRAY['text', 'jsonb', 'integer', 'text', 'integer', 'interval', 'bytea', 'jsonb']);
SELECT isnt_definer('idem_complete', ARRAY['text', 'jsonb', 'integer', 'text', 'integer', 'interval', 'bytea', 'jsonb']);
SELECT function_lang_is('idem_complete', ARRAY['text', 'jsonb', 'integer', 'text', 'integer', 'interval', 'bytea', 'jsonb'], 'c');

-- idem_fail
SELECT has_function('idem_fail', ARRAY['text', 'jsonb', 'integer', 'boolean', 'text', 'integer', 'interval', 'bytea', 'jsonb']);
SELECT function_returns('idem_fail', ARRAY['text', 'jsonb', 'integer', 'boolean', 'text', 'integer', 'interval', 'bytea', 'jsonb'], 'idem_keys');
SELECT is(pg_get_function_arguments('idem_fail(text,jsonb,integer,boolean,text,integer,interval,bytea,jsonb)'::regprocedure),
          'key text, response jsonb DEFAULT NULL::jsonb, response_code integer DEFAULT 500, '
          'retryable boolean DEFAULT true, scope text DEFAULT ''''::text, attempt integer DEFAULT NULL::integer, '
          'ttl interval DEFAULT NULL::interval, body bytea DEFAULT NULL::bytea, headers jsonb DEFAULT NULL::jsonb',
          'idem_fail argument names and defaults');
SELECT volatility_is('idem_fail', ARRAY['text', 'jsonb', 'integer', 'boolean', 'text', 'integer', 'interval', 'bytea', 'jsonb'], 'volatile');
SELECT isnt_strict('idem_fail', ARRAY['text', 'jsonb', 'integer', 'boolean', 'text', 'integer', 'interval', 'bytea', 'jsonb']);
SELECT isnt_definer('idem_fail', ARRAY['text', 'jsonb', 'integer', 'boolean', 'text', 'integer', 'interval', 'bytea', 'jsonb']);
SELECT function_lang_is('idem_fail', ARRAY['text', 'jsonb', 'integer', 'boolean', 'text', 'integer', 'interval', 'bytea', 'jsonb'], 'c');

-- idem_lookup
SELECT has_function('idem_lookup', ARRAY['text', 'text']);
SELECT function_returns('idem_lookup', ARRAY['text', 'text'], 'idem_keys');
SELECT is(pg_get_function_arguments('idem_lookup(text,text)'::regprocedure),
          'key text, scope text DEFAULT ''''::text',
          'idem_lookup argument names and defaults');
SELECT volatility_is('idem_lookup', ARRAY['text', 'text'], 'volatile');
SELECT isnt_strict('idem_lookup', ARRAY['text', 'text']);
SELECT isnt_definer('idem_lookup', ARRAY['text', 'text']);
SELECT function_lang_is('idem_lookup', ARRAY['text', 'text'], 'c');

-- idem_reap
SELECT has_function('idem_reap', ARRAY['integer']);
SELECT function_returns('idem_reap', ARRAY['integer'], 'bigint');
SELECT is(pg_get_function_arguments('idem_reap(integer)'::regprocedure),
          'max_rows integer DEFAULT NULL::integer',
          'idem_reap argument names and defaults');
SELECT volatility_is('idem_reap', ARRAY['integer'], 'volatile');
SELECT isnt_strict('idem_reap', ARRAY['integer']);
SELECT isnt_definer('idem_reap', ARRAY['integer']);
SELECT function_lang_is('idem_reap', ARRAY['integer'], 'c');

-- idem_reap_all (a procedure: it commits per batch)
SELECT has_function('idem_reap_all', ARRAY['integer', 'bigint']);
SELECT is_procedure('idem_reap_all', ARRAY['integer', 'bigint']);
SELECT is(pg_get_function_arguments('idem_reap_all(integer,bigint)'::regprocedure),
          'IN batch_size integer DEFAULT NULL::integer, INOUT reaped bigint DEFAULT NULL::bigint',
          'idem_reap_all argument names, modes and defaults');
SELECT volatility_is('idem_reap_all', ARRAY['integer', 'bigint'], 'volatile');
SELECT isnt_strict('idem_reap_all', ARRAY['integer', 'bigint']);
SELECT isnt_definer('idem_reap_all', ARRAY['integer', 'bigint']);
SELECT is((SELECT proconfig FROM pg_proc WHERE oid = 'idem_reap_all(integer,bigint)'::regprocedure),
          NULL, 'idem_reap_all has no SET clause (it could not COMMIT with one)');

-- Writers must not run in parallel workers
SELECT is((SELECT proparallel::text FROM pg_proc WHERE oid = 'idem_claim(text,jsonb,text,interval,interval,bytea,interval)'::regprocedure),
          'u', 'idem_claim is PARALLEL UNSAFE');
SELECT is((SELECT proparallel::text FROM pg_proc WHERE oid = 'idem_complete(text,jsonb,integer,text,integer,interval,bytea,jsonb)'::regprocedure),
          'u', 'idem_complete is PARALLEL UNSAFE');
SELECT is((SELECT proparallel::text FROM pg_proc WHERE oid = 'idem_fail(text,jsonb,integer,boolean,text,integer,interval,bytea,jsonb)'::regprocedure),
          'u', 'idem_fail is PARALLEL UNSAFE');
SELECT is((SELECT proparallel::text FROM pg_proc WHERE oid = 'idem_reap(integer)'::regprocedure),
          'u', 'idem_reap is PARALLEL UNSAFE');

-- Every routine can be executed by PUBLIC (access is governed by the table privileges)
SELECT is((SELECT count(*)::int FROM pg_proc
            WHERE oid IN ('idem_claim(text,jsonb,text,interval,interval,bytea,interval)'::regprocedure,
                          'idem_complete(text,jsonb,integer,text,integer,interval,bytea,jsonb)'::regprocedure,
                          'idem_fail(text,jsonb,integer,boolean,text,integer,interval,bytea,jsonb)'::regprocedure,
                          'idem_lookup(text,text)'::regprocedure,
                          'idem_reap(integer)'::regprocedure,
                          'idem_reap_all(integer,bigint)'::regprocedure)
              AND has_function_privilege('public', oid, 'EXECUTE')),
          6, 'PUBLIC may execute every routine');

-- 1.2: idem_extend, idem_release, idem_forget
SELECT is(pg_get_function_arguments('idem_extend(text,integer,interval,text)'::regprocedure),
          'key text, attempt integer, lease interval, scope text DEFAULT ''''::text',
          'idem_extend argument names and defaults');
SELECT function_returns('idem_extend', ARRAY['text', 'integer', 'interval', 'text'], 'idem_keys');
SELECT is(pg_get_function_arguments('idem_release(text,integer,text)'::regprocedure),
          'key text, attempt integer, scope text DEFAULT ''''::text',
          'idem_release argument names and defaults');
SELECT function_returns('idem_release', ARRAY['text', 'integer', 'text'], 'idem_keys');
SELECT is(pg_get_function_arguments('idem_forget(text,text,boolean)'::regprocedure),
          'key text, scope text DEFAULT ''''::text, force boolean DEFAULT false',
          'idem_forget argument names and defaults');
SELECT function_returns('idem_forget', ARRAY['text', 'text', 'boolean'], 'boolean');
SELECT is((SELECT count(*)::int FROM pg_proc
            WHERE oid IN ('idem_extend(text,integer,interval,text)'::regprocedure,
                          'idem_release(text,integer,text)'::regprocedure,
                          'idem_forget(text,text,boolean)'::regprocedure)
              AND provolatile = 'v' AND NOT proisstrict AND NOT prosecdef AND proparallel = 'u'),
          3, '1.2''s functions are VOLATILE, not STRICT, not SECURITY DEFINER, PARALLEL UNSAFE');

-- idem_edition (1.6): which edition answers
SELECT has_function('idem_edition', ARRAY[]::text[]);
SELECT is(idem_edition(), 'c', 'idem_edition() answers c in the C edition');
SELECT volatility_is('idem_edition', ARRAY[]::text[], 'stable');
SELECT isnt_definer('idem_edition', ARRAY[]::text[]);

SELECT * FROM finish();
ROLLBACK;
