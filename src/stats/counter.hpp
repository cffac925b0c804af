// What the statistics count (docs/contract.md §2 idem_stats, §10 idem_scope_stats): one vocabulary
// for the per-database counters (stats/dbstats), the per-scope ones (stats/scopestats) and the code
// that counts (stats/stats).
#pragma once

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

} // namespace idem
