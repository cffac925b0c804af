// Which reaper serves which database, in shared memory: a reaper claims its database before it
// reaps, so that a restarted launcher never doubles a reaper that is still running. Only with
// shared_preload_libraries.
#pragma once

#include "common/pg.hpp"

namespace idem {

// shared_preload_libraries only: ask for the shared memory and install the startup hook.
void reapers_request_shmem();

// Claim the database for this process: false if another live reaper has it. Released at process
// exit.
bool reaper_claim(Oid dboid);

// The pid of the reaper that serves the database, or 0.
int reaper_pid(Oid dboid);

} // namespace idem
