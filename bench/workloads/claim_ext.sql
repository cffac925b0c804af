-- claim_new / extension: claim a new key in autocommit, lease mode
SELECT * FROM idem_claim(gen_random_uuid()::text,
                         '{"amount": 4200, "currency": "EUR", "customer": "cus_0000004217"}'::jsonb,
                         'POST /payments', lease => interval '30 seconds');
