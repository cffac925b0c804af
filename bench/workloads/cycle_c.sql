-- cycle / reference (c): raw prepared statements, no functions:
-- BEGIN; INSERT ... ON CONFLICT DO NOTHING RETURNING; UPDATE ... WHERE state = 'pending'; COMMIT
BEGIN;
INSERT INTO ref.keys_c
       (scope, key, state, attempt, fingerprint, created_at, locked_until, expires_at)
VALUES ('POST /payments', gen_random_uuid()::text, 'pending', 1,
        sha256(convert_to('POST /payments', 'UTF8') || '\x00'::bytea
              || convert_to('{"amount": 4200, "currency": "EUR", "customer": "cus_0000004217"}'::jsonb::text, 'UTF8')),
        clock_timestamp(), clock_timestamp() + interval '1 minute',
        clock_timestamp() + interval '1 day')
ON CONFLICT DO NOTHING
RETURNING key, attempt \gset
UPDATE ref.keys_c
   SET state = 'succeeded', response = '{"id": "pay_0000004217", "amount": 4200, "status": "succeeded"}'::jsonb,
       response_code = 201, completed_at = clock_timestamp(), locked_until = NULL
 WHERE scope = 'POST /payments' AND key = :key AND state = 'pending';
COMMIT;
