-- idempotency: settings (docs/contract.md §6).
-- The GUCs exist once the library is loaded: with shared_preload_libraries, or at the
-- first call of one of its functions in this session (the first test does that).
BEGIN;
SELECT plan(30);

SELECT is(idem_lookup('tap-settings-no-such-key'), NULL,
          'idem_lookup of an unknown key is NULL (and loads the library)');

-- Defaults, as SHOW / current_setting print them
SELECT is(current_setting('idempotency.default_ttl'), '1d', 'idempotency.default_ttl defaults to 1d');
SELECT is(current_setting('idempotency.default_lease'), '1min', 'idempotency.default_lease defaults to 1min');
SELECT is(current_setting('idempotency.max_key_length'), '255', 'idempotency.max_key_length defaults to 255');
SELECT is(current_setting('idempotency.reaper_batch_size'), '1000', 'idempotency.reaper_batch_size defaults to 1000');

-- Types, units, contexts and ranges
SELECT results_eq(
    $$SELECT name::text, vartype::text, coalesce(unit, '')::text, context::text, boot_val::text
        FROM pg_settings
       WHERE name IN ('idempotency.default_ttl', 'idempotency.default_lease',
                      'idempotency.max_key_length', 'idempotency.reaper_batch_size',
                      'idempotency.track', 'idempotency.track_scopes')
       ORDER BY name$$,
    $$VALUES ('idempotency.default_lease',     'integer', 'ms', 'user',      '60000'),
             ('idempotency.default_ttl',       'integer', 's',  'user',      '86400'),
             ('idempotency.max_key_length',    'integer', '',   'superuser', '255'),
             ('idempotency.reaper_batch_size', 'integer', '',   'sighup',    '1000'),
             ('idempotency.track',             'bool',    '',   'superuser', 'on'),
             ('idempotency.track_scopes',      'integer', '',   'postmaster', '1000')$$,
    'type, unit, context and built-in default of each setting');
SELECT is((SELECT min_val || '..' || max_val FROM pg_settings WHERE name = 'idempotency.max_key_length'),
          '1..2000', 'idempotency.max_key_length ranges over 1..2000');
SELECT is((SELECT min_val || '..' || max_val FROM pg_settings WHERE name = 'idempotency.reaper_batch_size'),
          '1..1000000', 'idempotency.reaper_batch_size ranges over 1..1000000');
SELECT is((SELECT min_val::int > 0 FROM pg_settings WHERE name = 'idempotency.default_ttl'),
          true, 'idempotency.default_ttl must be positive');
SELECT is((SELECT min_val::int > 0 FROM pg_settings WHERE name = 'idempotency.default_lease'),
          true, 'idempotency.default_lease must be positive');

-- user settings: anyone may SET them, units are accepted
SET LOCAL idempotency.default_ttl = '2h';
SELECT is(current_setting('idempotency.default_ttl'), '2h', 'SET idempotency.default_ttl = 2h');
SET LOCAL idempotency.default_lease = '1500ms';
SELECT is(current_setting('idempotency.default_lease'), '1500ms', 'SET idempotency.default_lease = 1500ms');
SET LOCAL idempotency.default_lease = '30s';
SELECT is(current_setting('idempotency.default_lease'), '30s', 'SET idempotency.default_lease = 30s');
SELECT throws_ok($$SET LOCAL idempotency.default_ttl = 0$$, '22023', NULL,
                 'idempotency.default_ttl = 0 is rejected');
SELECT throws_ok($$SET LOCAL idempotency.default_lease = -1$$, '22023', NULL,
                 'idempotency.default_lease = -1 is rejected');

-- the session values are the defaults of idem_claim's ttl and lease
SELECT ok((SELECT expires_at > clock_timestamp() + interval '2h' - interval '1 min'
              AND expires_at <= clock_timestamp() + interval '2h'
             FROM idem_claim('tap-settings-defaults')),
          'idem_claim without ttl uses idempotency.default_ttl');
SELECT ok((SELECT locked_until > clock_timestamp()
              AND locked_until <= clock_timestamp() + interval '30s'
              AND locked_until > clock_timestamp() + interval '30s' - interval '1 min'
             FROM idem_keys WHERE scope = '' AND key = 'tap-settings-defaults'),
          'idem_claim without lease uses idempotency.default_lease');

-- max_key_length: superuser context, range enforced, used by the key check
SET LOCAL idempotency.max_key_length = 10;
SELECT is(current_setting('idempotency.max_key_length'), '10', 'superuser may SET idempotency.max_key_length');
SELECT throws_ok($$SELECT idem_claim('tap-key-too-long')$$, '22023',
                 'argument "key" must be 1 to 10 characters long',
                 'the key check uses the current idempotency.max_key_length');
SELECT lives_ok($$SELECT idem_claim('tap-10-chr')$$, 'a key of exactly max_key_length characters is accepted');
SELECT throws_ok($$SET LOCAL idempotency.max_key_length = 0$$, '22023', NULL,
                 'idempotency.max_key_length = 0 is rejected');
SELECT throws_ok($$SET LOCAL idempotency.max_key_length = 2001$$, '22023', NULL,
                 'idempotency.max_key_length = 2001 is rejected');
SELECT lives_ok($$SET LOCAL idempotency.max_key_length = 2000$$, 'idempotency.max_key_length = 2000 is accepted');
RESET idempotency.max_key_length;
SELECT is(current_setting('idempotency.max_key_length'), '255', 'RESET idempotency.max_key_length');

-- reaper_batch_size: sighup, cannot be SET in a session
SELECT throws_ok($$SET LOCAL idempotency.reaper_batch_size = 10$$, '55P02', NULL,
                 'idempotency.reaper_batch_size cannot be SET in a session');

-- the idempotency prefix is reserved: unknown names are refused
SELECT throws_ok($$SET LOCAL idempotency.no_such_setting = 1$$, '42602', NULL,
                 'unknown idempotency.* setting is refused (reserved prefix)');

-- non-superusers may set the user settings but not max_key_length
CREATE ROLE regress_idem_tap_guc;
SET ROLE regress_idem_tap_guc;
SELECT lives_ok($$SET LOCAL idempotency.default_ttl = '1h'$$, 'a non-superuser may SET idempotency.default_ttl');
SELECT lives_ok($$SET LOCAL idempotency.default_lease = '5s'$$, 'a non-superuser may SET idempotency.default_lease');
SELECT throws_ok($$SET LOCAL idempotency.max_key_length = 20$$, '42501', NULL,
                 'a non-superuser may not SET idempotency.max_key_length');
SELECT is(current_setting('idempotency.max_key_length'), '255', 'non-superuser sees max_key_length');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
