-- cycle / extension: BEGIN; claim a new key; complete it; COMMIT
BEGIN;
SELECT g.k AS key, c.attempt
  FROM (SELECT gen_random_uuid()::text AS k) g,
       idem_claim(g.k, '{"amount": 4200, "currency": "EUR", "customer": "cus_0000004217"}'::jsonb,
                  'POST /payments') c \gset
SELECT attempt FROM idem_complete(:key, '{"id": "pay_0000004217", "amount": 4200, "status": "succeeded"}'::jsonb,
                                  201, 'POST /payments');
COMMIT;
