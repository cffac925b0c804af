-- claim_new / reference (b): INSERT ... ON CONFLICT DO UPDATE ... RETURNING xmax = 0
SELECT * FROM ref.claim_b(gen_random_uuid()::text,
                          '{"amount": 4200, "currency": "EUR", "customer": "cus_0000004217"}'::jsonb,
                          'POST /payments', p_lease => interval '30 seconds');
