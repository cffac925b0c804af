-- replay / extension: claim a random completed key (bench.load_replay() loaded nkeys of them)
-- with the same request: outcome replay, the stored response
\set i random(1, :nkeys)
SELECT * FROM idem_claim(md5(:i::text)::uuid::text,
                         '{"amount": 4200, "currency": "EUR", "customer": "cus_0000004217"}'::jsonb,
                         'POST /payments');
