-- cycle / reference (a): BEGIN; ref.claim_a; ref.complete_a; COMMIT
BEGIN;
SELECT g.k AS key, c.attempt
  FROM (SELECT gen_random_uuid()::text AS k) g,
       ref.claim_a(g.k, '{"amount": 4200, "currency": "EUR", "customer": "cus_0000004217"}'::jsonb,
                   'POST /payments') c \gset
SELECT attempt FROM ref.complete_a(:key, '{"id": "pay_0000004217", "amount": 4200, "status": "succeeded"}'::jsonb,
                                   201, 'POST /payments');
COMMIT;
