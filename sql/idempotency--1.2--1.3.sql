-- idempotency 1.2 -> 1.3: per-scope statistics (SPEC §10) and batch claims for message consumers.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.3'" to load this file. \quit
