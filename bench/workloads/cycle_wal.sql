-- cycle / floor "WAL only": the null cycle plus a transactional WAL record about the size of
-- what the extension's cycle writes (its insert, confirmation, index entry and update, ~650 bytes
-- with the commit record): a transaction that must flush about as much WAL at commit and does
-- no other work. No implementation of the cycle that writes this much can be faster.
BEGIN;
SELECT gen_random_uuid()::text AS key \gset
SELECT pg_logical_emit_message(true, 'idempotency-bench', repeat('x', 560)) IS NOT NULL AS written;
COMMIT;
