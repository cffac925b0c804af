-- idempotency: read-only transactions (docs/contract.md §5: 25006 in a read-only transaction).
-- The writing functions refuse to run; idem_lookup, which writes nothing, still works.
-- (pgTAP itself only writes to temporary tables, which a read-only transaction allows.)
BEGIN;
SELECT plan(7);

SELECT is((idem_claim('tap-ro')).outcome, 'claimed', 'claim tap-ro before going read-only');
SET LOCAL transaction_read_only = on;

SELECT throws_ok($$SELECT idem_claim('tap-ro-new')$$, '25006', NULL,
                 'read-only transaction: idem_claim -> 25006');
SELECT throws_ok($$SELECT idem_claim('tap-ro')$$, '25006', NULL,
                 'read-only transaction: idem_claim of an existing key -> 25006');
SELECT throws_ok($$SELECT idem_complete('tap-ro', '{}')$$, '25006', NULL,
                 'read-only transaction: idem_complete -> 25006');
SELECT throws_ok($$SELECT idem_fail('tap-ro')$$, '25006', NULL,
                 'read-only transaction: idem_fail -> 25006');
SELECT throws_ok($$SELECT idem_reap()$$, '25006', NULL,
                 'read-only transaction: idem_reap -> 25006');
SELECT is((idem_lookup('tap-ro')).state, 'pending', 'read-only transaction: idem_lookup works');

SELECT * FROM finish();
ROLLBACK;
