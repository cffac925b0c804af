#include "access/expiry.hpp"

#include "access/bitmapsweep.hpp"
#include "common/compat.hpp"

extern "C" {
#include "access/brin_revmap.h"
#include "catalog/pg_am_d.h"
}

namespace idem {

// Where this backend's last bitmap expiry scan stopped, for the table with this storage.
static compat::Storage expiry_resume_storage;
static BlockNumber expiry_resume_block = 0;

void
keytable_expiry_begin(KeyTable *kt, ExpiryScan *es, TimestampTz until, Snapshot snapshot)
{
	memset(es, 0, sizeof(*es));
	es->until = until;
	ScanKeyData key = kt->catalog.expiry_scankey;
	key.sk_argument = TimestampTzGetDatum(until);
	if (kt->expiry->rd_indam->amgettuple != nullptr)
	{
		es->scan = compat::begin_index_scan(kt->rel, kt->expiry, snapshot, 1, 0);
		index_rescan(es->scan, &key, 1, nullptr, 0);
		return;
	}
	IndexScanDesc scan = compat::begin_index_bitmap_scan(kt->expiry, snapshot, 1);
	index_rescan(scan, &key, 1, nullptr, 0);
	TIDBitmap *bitmap = tbm_create(work_mem * INT64CONST(1024), nullptr);
	index_getbitmap(scan, bitmap);
	index_endscan(scan);
	bool same_storage = compat::same_storage(expiry_resume_storage, compat::storage_of(kt->rel));
	es->sweep = bitmap_sweep_begin(kt->rel, snapshot, bitmap, same_storage ? expiry_resume_block : 0);
}

bool
keytable_expiry_next(KeyTable *kt, ExpiryScan *es)
{
	if (es->scan != nullptr)
		return index_getnext_slot(es->scan, ForwardScanDirection, kt->found);
	while (bitmap_sweep_next(es->sweep, kt->found))
	{
		// The bitmap is lossy: a page of a summarized range may hold keys that expire later.
		bool isnull;
		Datum expires = slot_getattr(kt->found, kt->catalog.attnum[COL_EXPIRES_AT], &isnull);
		if (!isnull && DatumGetTimestampTz(expires) <= es->until)
		{
			expiry_resume_storage = compat::storage_of(kt->rel);
			expiry_resume_block = ItemPointerGetBlockNumber(&kt->found->tts_tid);
			return true;
		}
	}
	return false;
}

void
keytable_expiry_end(ExpiryScan *es)
{
	if (es->scan != nullptr)
		index_endscan(es->scan);
	else
		bitmap_sweep_end(es->sweep);
}

// Is the range that starts at this block summarized (or being summarized right now)?
static bool
range_summarized(BrinRevmap *revmap, BlockNumber start, Buffer *buf)
{
	OffsetNumber off;
	BrinTuple *summary =
	    compat::brin_range_summary(revmap, start, buf, &off, BUFFER_LOCK_SHARE);
	if (summary == nullptr)
		return false;
	LockBuffer(*buf, BUFFER_LOCK_UNLOCK);
	return true;
}

static int
summarize_new_ranges(Relation rel, Relation index)
{
	if (index->rd_rel->relam != BRIN_AM_OID)
		return 0;

	// Autosummarization and vacuum summarize in table order, so the ranges without a summary are
	// the newest ones: walk back from the last complete range to the first summarized one. The
	// last, partial, range stays unsummarized: a summary of it would make every insert there
	// widen the summary, an index write per claim.
	BlockNumber per_range;
	BrinRevmap *revmap = compat::open_brin_range_map(index, &per_range);
	BlockNumber complete_end = RelationGetNumberOfBlocks(rel) / per_range * per_range;
	BlockNumber first_new = complete_end;
	Buffer buf = InvalidBuffer;
	while (first_new > 0 && !range_summarized(revmap, first_new - per_range, &buf))
		first_new -= per_range;
	if (BufferIsValid(buf))
		ReleaseBuffer(buf);
	brinRevmapTerminate(revmap);
	if (first_new == complete_end)
		return 0;

	// The lock that summarizing takes conflicts with vacuum's and with itself, never with DML.
	if (!ConditionalLockRelation(rel, ShareUpdateExclusiveLock))
		return 0;
	// brin_summarize_range asks for the index's owner, as VACUUM would; reaping is what a
	// caller with DELETE on idem_keys may do, and this is part of it.
	Oid saved_user;
	int saved_context;
	GetUserIdAndSecContext(&saved_user, &saved_context);
	SetUserIdAndSecContext(rel->rd_rel->relowner, saved_context | SECURITY_RESTRICTED_OPERATION);
	int summarized = 0;
	for (BlockNumber start = first_new; start < complete_end; start += per_range)
		summarized += DatumGetInt32(DirectFunctionCall2(brin_summarize_range,
		                                                ObjectIdGetDatum(RelationGetRelid(index)),
		                                                Int64GetDatum(static_cast<int64>(start))));
	SetUserIdAndSecContext(saved_user, saved_context);
	UnlockRelation(rel, ShareUpdateExclusiveLock);
	return summarized;
}

int
keytable_summarize_new_ranges(KeyTable *kt)
{
	return summarize_new_ranges(kt->rel, kt->expiry);
}

int
keytable_summarize_new_ranges_unopened(const Catalog *catalog)
{
	// The lock the SQL path's DELETE takes next: no upgrade.
	Relation rel = table_open(catalog->relid, RowExclusiveLock);
	Relation index = index_open(catalog->expiry_oid, RowExclusiveLock);
	int summarized = summarize_new_ranges(rel, index);
	index_close(index, NoLock);
	table_close(rel, NoLock);
	return summarized;
}

} // namespace idem
