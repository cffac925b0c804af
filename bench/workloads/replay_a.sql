-- replay / reference (a): the same with ref.claim_a
\set i random(1, :nkeys)
SELECT * FROM ref.claim_a(md5(:i::text)::uuid::text,
                          '{"amount": 4200, "currency": "EUR", "customer": "cus_0000004217"}'::jsonb,
                          'POST /payments');
