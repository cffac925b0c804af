// The SQL path to idem_keys, taken only when row-level security applies to the caller: the table
// access layer cannot evaluate policies, so rows are read and written with SQL through SPI, where
// the executor applies them (and checks privileges itself). The key-state rules stay in core/; this
// file offers the same row primitives as keytable.hpp, at the price of a parse and plan per call.
#pragma once

#include "access/keytable.hpp"

namespace idem {

struct PolicySql
{
	const Catalog *catalog;
	const char *table;      // schema-qualified idem_keys
	const char *state_type; // schema-qualified idem_state
	MemoryContext caller;   // results are copied here
	int guc_nest_level;
};

// Connects to SPI with a search_path of pg_catalog only, so that no object of the caller's
// search_path can stand in for the ones this SQL names.
void policy_begin(PolicySql *ps, const Catalog *catalog);
void policy_end(PolicySql *ps);

// INSERT ... ON CONFLICT DO NOTHING: true with the new row, false when the key exists.
bool policy_insert(PolicySql *ps, const KeyRow *row, KeyRow *out, Datum *whole);

// The key's row as the policies let this caller see it, with FOR NO KEY UPDATE when `lock`.
bool policy_fetch(PolicySql *ps, Datum scope, Datum key, bool lock, KeyRow *out,
                  TransactionId *xmin, Datum *whole);

// Replaces `old` (identified by its key, attempt, state and lease end) with `row`; false if it
// changed.
bool policy_update(PolicySql *ps, const KeyRow *old, const KeyRow *row, KeyRow *out, Datum *whole);

// Deletes `old` (identified by its key, attempt and state); false if it changed or is gone.
bool policy_delete(PolicySql *ps, const KeyRow *old);

// Deletes up to max_rows expired keys, skipping locked rows and live leases.
int64 policy_reap(PolicySql *ps, TimestampTz now, int32 max_rows);

// INSERT ... ON CONFLICT cannot be told not to wait: keytable_find_latest_until on a table
// keytable_open left closed, reading no column (the caller learns only whether another
// transaction holds the key, as the INSERT's wait would show it).
Found policy_probe_until(const Catalog *catalog, Datum scope, Datum key, TimestampTz deadline);

} // namespace idem
