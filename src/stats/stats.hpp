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
	reaped,      // keys deleted by a reap (idem_reap, idem_reap_all, the background reaper)
	reaper_runs, // reap batches run
	count
};

// shared_preload_libraries only: ask for the shared memory and install the startup hook.
void stats_request_shmem();

// Adds n to this database's counter (no-op without shared memory or a free slot).
void stats_count(Counter c, uint64 n = 1);

// One reap batch ran and deleted n keys: reaped += n, reaper_runs += 1, last_reap_at = now.
void stats_reaped(int64 n);

// Reaper bookkeeping: claim the database for this process (false if another live reaper has it;
// released at process exit), and ask whether a reaper serves the database (its pid, or 0).
bool stats_claim_reaper(Oid dboid);
int stats_reaper_pid(Oid dboid);

} // namespace idem
