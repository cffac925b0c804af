// What the key-state code counts, as it happens: each count goes to the database's counters
// (docs/contract.md §2 idem_stats, stats/dbstats) and to the scope's (docs/contract.md §10
// idem_scope_stats, stats/scopestats). Only with shared_preload_libraries: otherwise every call
// here is a no-op.
#pragma once

#include "common/pg.hpp"
#include "stats/counter.hpp"

namespace idem {

// One more `c` for this database and for its entry of `scope` (a text datum) in idem_scope_stats
// (no-op without shared memory or a free slot). Per scope, Counter::claims is counted with the
// claim's answer instead (scope_stats_count).
void stats_count(Counter c, Datum scope);

// An attempt of `scope` finished (Counter::completes, fails or releases; counted as stats_count
// does), claimed at `claimed_at` (0: unknown, then only counted).
void stats_finished(Counter c, Datum scope, TimestampTz claimed_at);

// A batch of one scope (idem_claim_batch): from stats_batch_begin to stats_batch_end, the counts
// of stats_count, and of stats_finished without a claim time, add up in this backend and reach
// shared memory once, with one lookup of the scope's entry instead of one per key. Every count in
// between is of `scope`. A batch ended by an error publishes its counts when the memory context
// current at stats_batch_begin goes.
void stats_batch_begin(Datum scope);
void stats_batch_end();

// One reap batch ran and deleted n keys: reaped += n, reaper_runs += 1, last_reap_at = now.
void stats_reaped(int64 n);

} // namespace idem
