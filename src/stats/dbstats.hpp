// Per-database counters in shared memory (docs/contract.md §2 idem_stats). Only with
// shared_preload_libraries: otherwise nothing is counted and idem_stats shows NULL counters.
//
// Counting never serializes callers nor shares a cache line between them: each backend counts in
// a slot of its own, and reading idem_stats sums the slots of the database (dbstats.cpp).
#pragma once

#include "common/pg.hpp"
#include "stats/counter.hpp"

namespace idem {

// shared_preload_libraries only: ask for the shared memory and install the startup hook.
void db_stats_request_shmem();

// n more `c` for this database, in this backend's slot; false when the backend counts nowhere
// (no shared memory, or no free slot).
bool db_stats_add(Counter c, uint64 n);
// counts[c] more of each Counter c, in one step.
bool db_stats_add_all(const uint64 *counts);

// n entries of database `dboid` were evicted from idem_scope_stats.
void db_stats_dealloc(Oid dboid, uint64 n);

// One reap batch ran and deleted n keys: reaped += n, reaper_runs += 1, last_reap_at = now.
void db_stats_reaped(int64 n);

// This database's counters since the last reset, total[c] for each Counter c (false without
// shared memory or a slot).
bool db_stats_counts(uint64 total[]);
// When this database was last reaped, and its counters last reset; false for never.
bool db_stats_last_reap_at(TimestampTz *t);
bool db_stats_reset_at(TimestampTz *t);
// Zero this database's counters (nothing to do without shared memory).
void db_stats_reset();

} // namespace idem
