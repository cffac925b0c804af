// Per-database counters in shared memory (SPEC §2 idem_stats), and the per-database record of
// which reaper serves a database (src/worker). Only with shared_preload_libraries: otherwise every
// call here is a no-op and idem_stats shows NULL counters.
//
// Counting never serializes callers nor shares a cache line between them: each backend counts in
// a slot of its own, and reading idem_stats sums the slots of the database (stats.cpp).
#pragma once

#include "common/pg.hpp"

namespace idem {

enum class Counter
{
	claims,      // idem_claim calls
	inserted,    // claims that inserted the key
	replays,     // claims answered with the stored outcome
	in_progress, // claims answered in_progress
	takeovers,   // claims that took over an abandoned or retryable key
	mismatches,  // claims refused with IK001
	completes,   // idem_complete calls that finished a key
	fails,       // idem_fail calls that finished a key
	releases,    // idem_release calls that ended a lease
	expired,     // claims that found their key expired and claimed it anew (also `inserted`)
	reaped,      // keys deleted by a reap (idem_reap, idem_reap_all, the background reaper)
	reaper_runs, // reap batches run
	dealloc,     // idem_scope_stats entries of the database evicted to make room
	count
};

// The counters idem_scope_stats keeps per scope: claims to expired.
constexpr int scope_counter_count = static_cast<int>(Counter::expired) + 1;

// shared_preload_libraries only: ask for the shared memory and install the startup hook.
void stats_request_shmem();

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

// n entries of database `dboid` were evicted from idem_scope_stats.
void stats_dealloc(Oid dboid, uint64 n);

// One reap batch ran and deleted n keys: reaped += n, reaper_runs += 1, last_reap_at = now.
void stats_reaped(int64 n);

// Reaper bookkeeping: claim the database for this process (false if another live reaper has it;
// released at process exit), and ask whether a reaper serves the database (its pid, or 0).
bool stats_claim_reaper(Oid dboid);
int stats_reaper_pid(Oid dboid);

} // namespace idem
