// What differs between the PostgreSQL majors this extension builds against (15, 16, 17, 18, 19),
// as small wrappers named for what the caller does; the callers stay free of PG_VERSION_NUM.
// 16 follows the lines written for it but is built by users, not tested here (README).
#pragma once

extern "C" {
#include "postgres.h"

#include "access/brin_revmap.h"
#include "access/genam.h"
#include "access/heapam.h"
#include "access/tableam.h"
#include "miscadmin.h"
#include "nodes/execnodes.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/acl.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#if PG_VERSION_NUM >= 160000
#include "catalog/pg_database_d.h"
#endif
}

namespace idem::compat {

// ---- a relation's storage: RelFileNode until 15, RelFileLocator from 16

#if PG_VERSION_NUM >= 160000
using Storage = RelFileLocator;
inline Storage
storage_of(Relation rel)
{
	return rel->rd_locator;
}
inline bool
same_storage(const Storage &a, const Storage &b)
{
	return RelFileLocatorEquals(a, b);
}
#else
using Storage = RelFileNode;
inline Storage
storage_of(Relation rel)
{
	return rel->rd_node;
}
inline bool
same_storage(const Storage &a, const Storage &b)
{
	return RelFileNodeEquals(a, b);
}
#endif

// ---- heap deletes and updates (19 took a bitmask of options in place of delete's changingPart:
// none here, as before)

inline TM_Result
tuple_delete(Relation rel, ItemPointer tid, CommandId cid, Snapshot snapshot, Snapshot crosscheck,
             bool wait, TM_FailureData *tmfd)
{
#if PG_VERSION_NUM >= 190000
	return table_tuple_delete(rel, tid, cid, 0, snapshot, crosscheck, wait, tmfd);
#else
	return table_tuple_delete(rel, tid, cid, snapshot, crosscheck, wait, tmfd, false);
#endif
}

// ---- which index entries a heap update needs

// From 16 an update may be HOT for the ordinary indexes and still need entries in the summarizing
// ones (BRIN): only those may then get one. An entry for a HOT tuple in a b-tree corrupts it.
enum class NewIndexEntries { none, summarizing_only, all };

inline TM_Result
tuple_update(Relation rel, ItemPointer otid, TupleTableSlot *slot, CommandId cid, Snapshot snapshot,
             Snapshot crosscheck, bool wait, TM_FailureData *tmfd, LockTupleMode *lockmode,
             NewIndexEntries *entries)
{
#if PG_VERSION_NUM >= 160000
	TU_UpdateIndexes update = TU_None;
#if PG_VERSION_NUM >= 190000
	TM_Result result = table_tuple_update(rel, otid, slot, cid, 0, snapshot, crosscheck, wait, tmfd,
	                                      lockmode, &update);
#else
	TM_Result result = table_tuple_update(rel, otid, slot, cid, snapshot, crosscheck, wait, tmfd,
	                                      lockmode, &update);
#endif
	*entries = update == TU_All           ? NewIndexEntries::all
	           : update == TU_Summarizing ? NewIndexEntries::summarizing_only
	                                      : NewIndexEntries::none;
#else
	bool update = false;
	TM_Result result = table_tuple_update(rel, otid, slot, cid, snapshot, crosscheck, wait, tmfd,
	                                      lockmode, &update);
	*entries = update ? NewIndexEntries::all : NewIndexEntries::none;
#endif
	return result;
}

// Does an index take entries for tuples that a HOT update wrote (BRIN from 16; none before)?
inline bool
index_summarizes(Relation index)
{
#if PG_VERSION_NUM >= 160000
	return index->rd_indam->amsummarizing;
#else
	(void) index;
	return false;
#endif
}

// ---- pruning a heap page on access (19 may also set the page all-visible then, in the visibility
// map, but only when the statement does not modify the table: ours do, so it never does here)

inline void
prune_page(Relation rel, Buffer buffer)
{
#if PG_VERSION_NUM >= 190000
	Buffer vm_buffer = InvalidBuffer;
	heap_page_prune_opt(rel, buffer, &vm_buffer, false);
	if (BufferIsValid(vm_buffer))
		ReleaseBuffer(vm_buffer);
#else
	heap_page_prune_opt(rel, buffer);
#endif
}

// ---- index insertions

// From 17 an index access method may keep state between the insertions of one statement until
// index_insert_cleanup (BRIN keeps its range map there, pages pinned). That state hangs off the
// IndexInfo, and ours are cached across statements and transactions (access/catalog): the state
// lives for one row's insertions, in the caller's memory, and is dropped, not trusted, when an
// error cut the previous row's short. Until 16 nothing is kept.
inline void
begin_row_index_inserts(IndexInfo *info)
{
#if PG_VERSION_NUM >= 170000
	info->ii_AmCache = nullptr;
	info->ii_Context = CurrentMemoryContext;
#else
	(void) info;
#endif
}

inline void
end_row_index_inserts(Relation index, IndexInfo *info)
{
#if PG_VERSION_NUM >= 170000
	index_insert_cleanup(index, info);
	info->ii_AmCache = nullptr;
#else
	(void) index;
	(void) info;
#endif
}

// ---- index scans (18 added an instrumentation argument: none here; 19 scan options: none, since
// SO_HINT_REL_READ_ONLY would claim that the statement does not modify the table, and ours do)

inline IndexScanDesc
begin_index_scan(Relation heap, Relation index, Snapshot snapshot, int nkeys, int norderbys)
{
#if PG_VERSION_NUM >= 190000
	return index_beginscan(heap, index, snapshot, nullptr, nkeys, norderbys, SO_NONE);
#elif PG_VERSION_NUM >= 180000
	return index_beginscan(heap, index, snapshot, nullptr, nkeys, norderbys);
#else
	return index_beginscan(heap, index, snapshot, nkeys, norderbys);
#endif
}

inline IndexScanDesc
begin_index_bitmap_scan(Relation index, Snapshot snapshot, int nkeys)
{
#if PG_VERSION_NUM >= 180000
	return index_beginscan_bitmap(index, snapshot, nullptr, nkeys);
#else
	return index_beginscan_bitmap(index, snapshot, nkeys);
#endif
}

// ---- bitmap heap scans (17 asks whether the tuples are needed: they are; 19 takes scan options:
// none, the sweep deletes what it finds)

inline TableScanDesc
begin_bitmap_heap_scan(Relation rel, Snapshot snapshot)
{
#if PG_VERSION_NUM >= 190000
	return table_beginscan_bm(rel, snapshot, 0, nullptr, SO_NONE);
#elif PG_VERSION_NUM >= 170000 && PG_VERSION_NUM < 180000
	return table_beginscan_bm(rel, snapshot, 0, nullptr, true);
#else
	return table_beginscan_bm(rel, snapshot, 0, nullptr);
#endif
}

// ---- BRIN's range map (17 dropped the snapshot argument, used only by old_snapshot_threshold)

inline BrinRevmap *
open_brin_range_map(Relation index, BlockNumber *pages_per_range)
{
#if PG_VERSION_NUM >= 170000
	return brinRevmapInitialize(index, pages_per_range);
#else
	return brinRevmapInitialize(index, pages_per_range, nullptr);
#endif
}

inline BrinTuple *
brin_range_summary(BrinRevmap *revmap, BlockNumber start, Buffer *buf, OffsetNumber *off, int mode)
{
#if PG_VERSION_NUM >= 170000
	return brinGetTupleForHeapBlock(revmap, start, buf, off, nullptr, mode);
#else
	return brinGetTupleForHeapBlock(revmap, start, buf, off, nullptr, mode, nullptr);
#endif
}

// ---- this backend's place among the server's processes

// A number from 0 to MaxBackends - 1 for a regular backend, -1 where there is none.
// (MyBackendId counted from 1 until 16; MyProcNumber counts from 0 from 17.)
inline int
my_backend_index()
{
#if PG_VERSION_NUM >= 170000
	return MyProcNumber == INVALID_PROC_NUMBER ? -1 : MyProcNumber;
#else
	return MyBackendId == InvalidBackendId ? -1 : MyBackendId - 1;
#endif
}

// A process's slot in the PGPROC array (17 dropped the pgprocno field).
inline int
proc_number(const PGPROC *proc)
{
#if PG_VERSION_NUM >= 170000
	return static_cast<int>(GetNumberFromPGProc(proc));
#else
	return proc->pgprocno;
#endif
}

// ---- shared memory (19 sizes a shared hash table once: no initial size apart from the maximum)

inline HTAB *
init_shmem_hash(const char *name, long max_entries, HASHCTL *info, int flags)
{
#if PG_VERSION_NUM >= 190000
	return ShmemInitHash(name, max_entries, info, flags);
#else
	return ShmemInitHash(name, max_entries, max_entries, info, flags);
#endif
}

// ---- catalog cache invalidation (19 names the cache of a callback by its enum, not an int)

#if PG_VERSION_NUM >= 190000
using SyscacheId = SysCacheIdentifier;
#else
using SyscacheId = int;
#endif

// ---- privileges

inline bool
owns_database(Oid database, Oid role)
{
#if PG_VERSION_NUM >= 160000
	return object_ownercheck(DatabaseRelationId, database, role);
#else
	return pg_database_ownercheck(database, role);
#endif
}

// ---- locks

// Has the transaction ended? Never waits; a busy lock is not logged (18's log_lock_failures).
inline bool
transaction_ended_without_waiting(TransactionId xid)
{
#if PG_VERSION_NUM >= 180000
	return ConditionalXactLockTableWait(xid, false);
#else
	return ConditionalXactLockTableWait(xid);
#endif
}

} // namespace idem::compat
