-- claim_new / reference (d): a plain single-row INSERT of the same row into a copy of idem_keys
-- (no ON CONFLICT): the physical limit of a claim
INSERT INTO ref.keys_plain
       (scope, key, state, attempt, fingerprint, created_at, claimed_at, locked_until, expires_at)
VALUES ('POST /payments', gen_random_uuid()::text, 'pending', 1,
        sha256(convert_to('POST /payments', 'UTF8') || '\x00'::bytea
              || convert_to('{"amount": 4200, "currency": "EUR", "customer": "cus_0000004217"}'::jsonb::text, 'UTF8')),
        clock_timestamp(), clock_timestamp(), clock_timestamp() + interval '30 seconds',
        clock_timestamp() + interval '1 day');
