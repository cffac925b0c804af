-- cycle / floor "null": the cycle's four round trips and its key, no table, no write: what every
-- variant pays before doing anything (the protocol, the transaction, pgbench itself)
BEGIN;
SELECT gen_random_uuid()::text AS key \gset
SELECT :key::text AS key;
COMMIT;
