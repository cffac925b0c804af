-- claim_new / reference (a): the PL/pgSQL state machine (bench/references.sql)
SELECT * FROM ref.claim_a(gen_random_uuid()::text,
                          '{"amount": 4200, "currency": "EUR", "customer": "cus_0000004217"}'::jsonb,
                          'POST /payments', p_lease => interval '30 seconds');
