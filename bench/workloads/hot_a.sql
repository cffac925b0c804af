-- hot_key / reference (a): 32 clients on 100 keys, the transactional cycle. Every 100 ms a fresh set
-- of 100 keys ('hot-<slot>-<tenth of a second>'): the first claimer of a key completes it, the
-- duplicates that arrive meanwhile wait for its transaction and replay.
\set slot random(1, 100)
BEGIN;
SELECT g.k AS key, (c.outcome = 'claimed')::int AS claimed
  FROM (SELECT 'hot-' || :slot::int || '-'
               || floor(extract(epoch FROM clock_timestamp()) * 10)::bigint AS k) g,
       ref.claim_a(g.k, '{"amount": 4200, "currency": "EUR", "customer": "cus_0000004217"}'::jsonb,
                  'POST /payments') c \gset
\if :claimed
SELECT attempt FROM ref.complete_a(:key, '{"id": "pay_0000004217", "amount": 4200, "status": "succeeded"}'::jsonb,
                                  201, 'POST /payments');
\endif
COMMIT;
