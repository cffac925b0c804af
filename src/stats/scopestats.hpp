// Per-scope statistics (SPEC §10, the idem_scope_stats view): shared-memory entries per
// (database, scope), bounded by idempotency.track_scopes, least used evicted first. Only with
// shared_preload_libraries and idempotency.track = on; otherwise nothing is counted and the view
// has no rows. stats.cpp forwards the per-scope counters here; keystate reads the work times for
// its Retry-After estimate.
#pragma once

#include "common/pg.hpp"

namespace idem {

enum class Counter;

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

} // namespace idem
