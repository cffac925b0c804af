--
-- ttl and lease must move the clock forward (docs/contract.md §2: "both must be positive").  PostgreSQL
-- compares intervals with a month as 30 days and a year as 360, but the functions add them to
-- the clock as calendar months and days.  An interval with parts of mixed signs can therefore
-- compare as positive and still move the clock backwards, on every date: '-1 year 361 days'
-- compares as +1 day, but a calendar year is 365 or 366 days, so clock + it is 4 or 5 days in
-- the past.  Such a lease would be over before it starts (the next claim takes the key over at
-- once: two workers run the side effect), such a ttl would make a new key expired at birth.
-- These must be refused with 22023, as '1 month -30 days' is.
--
\pset null '(null)'
\getenv abs_srcdir PG_ABS_SRCDIR
\set expect_error :abs_srcdir '/sql/expect_error.psql'
\i :expect_error

-- positive as PostgreSQL compares them, backwards on the calendar whatever the date
SELECT i AS "interval", i > interval '0' AS compares_positive,
       now() + i > now() AS moves_clock_forward
FROM (VALUES (interval '-1 year 361 days'), (interval '-12 mons 365 days'),
             (interval '-100 years 36500 days')) v(i);

CALL pg_temp.expect_error($$SELECT idem_claim('iv-lease-1', NULL, 'iv', lease => '-1 year 361 days')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('iv-lease-2', NULL, 'iv', lease => '-12 mons 365 days')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('iv-lease-3', NULL, 'iv', lease => '-100 years 36500 days')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('iv-ttl-1', NULL, 'iv', ttl => '-1 year 361 days')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('iv-ttl-2', NULL, 'iv', ttl => '-12 mons 365 days')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('iv-ttl-3', NULL, 'iv', ttl => '-100 years 36500 days')$$);
-- on an existing key too
SELECT outcome FROM idem_claim('iv-existing', NULL, 'iv');
CALL pg_temp.expect_error($$SELECT idem_claim('iv-existing', NULL, 'iv', lease => '-1 year 361 days')$$);

-- Keys that were wrongly accepted (none when the arguments are refused), and what their leases
-- and ttls are worth: a lease in the past lets the next claim take the key over at once.
SELECT key, attempt, locked_until > created_at AS lease_in_future,
       expires_at > created_at AS ttl_in_future
FROM idem_keys WHERE scope = 'iv' AND key <> 'iv-existing' ORDER BY key;
SELECT k.key, c.outcome, c.inserted, c.attempt
FROM (SELECT key FROM idem_keys WHERE scope = 'iv' AND key LIKE 'iv-lease-%') k
CROSS JOIN LATERAL idem_claim(k.key, NULL, 'iv') c ORDER BY k.key;
DELETE FROM idem_keys WHERE scope = 'iv';

-- mixed signs that really are positive on every date are still accepted
SELECT outcome, inserted FROM idem_claim('iv-2', NULL, 'iv', lease => '1 year -359 days', ttl => '1 day -1 hour');
SELECT locked_until > created_at AS lease_in_future, expires_at > created_at AS ttl_in_future
FROM idem_keys WHERE scope = 'iv' AND key = 'iv-2';
DELETE FROM idem_keys WHERE scope = 'iv';
