-- memory / extension: one session claims new keys (autocommit); bench.probe() records the
-- backend's memory (pg_backend_memory_contexts, RssAnon) after the warm-up and at the end
\set n :n + 1
\if :n = :warm
SELECT bench.probe('before');
\endif
SELECT * FROM idem_claim(gen_random_uuid()::text,
                         '{"amount": 4200, "currency": "EUR", "customer": "cus_0000004217"}'::jsonb,
                         'POST /payments', lease => interval '30 seconds');
\if :n = :last
SELECT bench.probe('after');
\endif
