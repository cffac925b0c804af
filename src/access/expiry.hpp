// The reaper's side of idem_keys: the scan of expired keys through the index on expires_at, and
// the summarizing of new block ranges when that index is BRIN.
#pragma once

#include "access/keytable.hpp"

namespace idem {

// Walks the keys with expires_at <= until that an MVCC snapshot sees. With an ordered index
// (btree) oldest first; with a summarizing one (BRIN) in block order, starting where this
// backend's previous scan stopped, so that successive batches do not pass over the pages they
// emptied.
struct ExpiryScan
{
	TimestampTz until;
	IndexScanDesc scan;          // ordered index scan
	struct BitmapSweep *sweep;   // else the bitmap's pages (access/bitmapsweep.hpp)
};
void keytable_expiry_begin(KeyTable *kt, ExpiryScan *es, TimestampTz until, Snapshot snapshot);
bool keytable_expiry_next(KeyTable *kt, ExpiryScan *es);
void keytable_expiry_end(ExpiryScan *es);

// Summarizes the complete block ranges at the end of the table that the BRIN index of expires_at
// does not summarize yet, so that the expiry scan skips them until their keys expire. Cost: one
// index lookup when there is nothing to do, else the new ranges only. Takes the table's
// ShareUpdateExclusiveLock for the summarizing only, and only when it is free at once (a vacuum
// holding it summarizes them itself); claims (RowExclusiveLock) are never blocked by it. Returns
// the ranges summarized.
int keytable_summarize_new_ranges(KeyTable *kt);
// The same for the SQL path (row-level security), on a table keytable_open left closed. The
// ranges hold every scope's keys, but summarizing reads and changes no row and tells the caller
// nothing of them: the maintenance any reaper's DELETE privilege allows, as on the direct path.
int keytable_summarize_new_ranges_unopened(const Catalog *catalog);

} // namespace idem
