// Per-scope statistics (docs/contract.md §10, the idem_scope_stats view): shared-memory entries per
// (database, scope), bounded by idempotency.track_scopes, least used evicted first. Only with
// shared_preload_libraries and idempotency.track = on; otherwise nothing is counted and the view
// has no rows. stats/stats.cpp forwards the per-scope counters here; core/rules.cpp reads the work
// times for its Retry-After estimate.
#pragma once

#include "common/pg.hpp"
#include "stats/counter.hpp"

namespace idem {

// shared_preload_libraries only: ask for the shared memory and install the startup hook.
void scope_stats_request_shmem();

// One more `c` in the current database's entry for `scope` (a text datum), created when missing;
// a claim's answer (inserted, takeovers, replays, in_progress, mismatches) also counts the claim.
void scope_stats_count(Counter c, Datum scope);

// scope_stats_count for many counts at once: counts[c] more of each Counter c below
// scope_counter_count, in one lookup.
void scope_stats_add(Datum scope, const uint64 *counts);

// An attempt of `scope` finished (complete, fail or release: `c`) `elapsed_us` after its claim.
void scope_stats_finished(Counter c, Datum scope, int64 elapsed_us);

// The scope's recent claim-to-finish times at the 90th and 99th percentiles, in microseconds;
// false while the statistics do not know enough of them.
bool scope_stats_work_times(Datum scope, int64 *p90_us, int64 *p99_us);

// Whether there are per-scope statistics (the shared memory of a preloaded library).
bool scope_stats_enabled();

// One row of idem_scope_stats: the scope's name (len bytes, not terminated), its counters, and
// its recent claim-to-finish times at the 50th, 90th and 99th percentiles, when it has any.
struct ScopeRow
{
	const char *scope;
	int len;
	uint64 count[scope_counter_count];
	bool has_times;
	double work_ms[3];
};
using ScopeRowEmit = void (*)(void *arg, const ScopeRow *row);

// emit(arg, row) for each scope of the current database, under the statistics' shared lock.
// Only when scope_stats_enabled().
void scope_stats_each(ScopeRowEmit emit, void *arg);

// Forget the current database's scopes.
void scope_stats_forget_database();

} // namespace idem
