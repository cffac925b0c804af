// Module entry: the library's magic block and its load-time setup.
#include "access/catalog.hpp"
#include "access/writememo.hpp"
#include "common/pg.hpp"
#include "common/preload.hpp"
#include "common/settings.hpp"
#include "core/wait.hpp"
#include "stats/dbstats.hpp"
#include "stats/scopestats.hpp"
#include "worker/reapers.hpp"
#include "worker/worker.hpp"

extern "C" {
PG_MODULE_MAGIC;

void _PG_init(void);

void
_PG_init(void)
{
	// pg_upgrade's server runs no worker and needs nothing from us.
	if (IsBinaryUpgrade)
		return;
	idem::define_settings();
	idem::preload_note_loading();
	idem::catalog_register_invalidation();
	idem::writememo_register_callbacks();
	idem::wait_register_callbacks();
	// Shared memory (idem_stats, idem_scope_stats, waking waiting claims, which reaper serves which
	// database) and the background reaper exist only when preloaded.
	if (process_shared_preload_libraries_in_progress)
	{
		idem::db_stats_request_shmem();
		idem::scope_stats_request_shmem();
		idem::wait_request_shmem();
		idem::reapers_request_shmem();
		idem::worker_register();
	}
}
}
