// The background reaper (docs/contract.md §8): a launcher, and one reaper per database that has the
// extension (or per database in idempotency.reaper_databases). Only with shared_preload_libraries.
#pragma once

namespace idem {

// From _PG_init while shared_preload_libraries are being processed: registers the launcher and
// installs the utility hook that stops a database's reaper before DROP DATABASE and friends.
void worker_register();

} // namespace idem
