#include "access/keytable.hpp"

#include "access/lockwait.hpp"
#include "access/rowsecurity.hpp"
#include "access/writememo.hpp"
#include "common/compat.hpp"

namespace idem {

// Heap operations take a snapshot argument that heapam only uses for crosscheck: the statement's.
static Snapshot
statement_snapshot()
{
	return ActiveSnapshotSet() ? GetActiveSnapshot() : InvalidSnapshot;
}

static AclMode
privileges_for(Access access)
{
	switch (access)
	{
		case Access::read:
			return ACL_SELECT;
		case Access::write:
			return ACL_SELECT | ACL_INSERT | ACL_UPDATE;
		case Access::update:
			return ACL_SELECT | ACL_UPDATE;
		case Access::forget:
			return ACL_SELECT | ACL_DELETE;
		case Access::reap:
			return ACL_DELETE;
	}
	pg_unreachable();
}

// Opens idem_keys by its cached OID. Taking the lock processes invalidations: if one made the
// cached OIDs stale (the extension was dropped or recreated), close and look again.
static void
open_table(KeyTable *kt, LOCKMODE lockmode)
{
	for (int tries = 0;; tries++)
	{
		const Catalog *catalog = catalog_get();
		Relation rel = try_table_open(catalog->relid, lockmode);
		if (rel != nullptr && catalog_is_current(catalog))
		{
			// Under the table's lock the index list cannot change but by our own transaction,
			// whose DDL invalidates the catalog like anyone's.
			catalog_load_indexes(rel);
			if (catalog_is_current(catalog))
			{
				kt->catalog = *catalog;
				kt->rel = rel;
				return;
			}
		}
		if (rel != nullptr)
			table_close(rel, lockmode);
		if (tries >= 10)
			elog(ERROR, "idempotency: idem_keys keeps changing while being opened");
	}
}

// The indexes that a write maintains, opened on the first write of the call: claims answered
// from an existing row (replay, in_progress) never need them.
static void
open_indexes(KeyTable *kt)
{
	if (kt->indexes != nullptr)
		return;
	int n = kt->catalog.nindexes;
	kt->indexes = (Relation *) palloc(sizeof(Relation) * n);
	kt->index_info = (IndexInfo **) palloc(sizeof(IndexInfo *) * n);
	for (int i = 0; i < n; i++)
	{
		Oid oid = kt->catalog.index_oid[i];
		kt->indexes[i] = oid == kt->catalog.pkey_oid ? kt->pkey : index_open(oid, kt->lockmode);
	}
	// An invalidation processed since the catalog was copied (by these opens, or earlier in the
	// call: the claim may have waited in between) may have rebuilt the relcache entry of an index
	// that was not open, such as the expiry index after VACUUM or ANALYZE. The cached IndexInfos
	// then hold what the access method cached from the old entry (BRIN's BrinDesc points to its
	// freed tuple descriptor): build this call's own.
	bool cached = catalog_is_current(&kt->catalog);
	for (int i = 0; i < n; i++)
		kt->index_info[i] = cached && kt->catalog.index_info[i] != nullptr ? kt->catalog.index_info[i]
		                                                                   : BuildIndexInfo(kt->indexes[i]);
	kt->nindexes = n;
	TupleDesc desc = RelationGetDescr(kt->rel);
	kt->written = MakeSingleTupleTableSlot(desc, &TTSOpsHeapTuple);
	kt->written_values = (Datum *) palloc(sizeof(Datum) * desc->natts);
	kt->written_isnull = (bool *) palloc(sizeof(bool) * desc->natts);
}

// PostgreSQL's own error for the equivalent SQL (42501, "permission denied for table"), with the
// grant that fixes it: the privileges this call needs, by name (docs/security.md).
static void
missing_privileges(const KeyTable *kt, AclMode needed, const char *caller)
{
	static const struct
	{
		AclMode mode;
		const char *name;
	} names[] = {{ACL_SELECT, "SELECT"}, {ACL_INSERT, "INSERT"}, {ACL_UPDATE, "UPDATE"}, {ACL_DELETE, "DELETE"}};
	StringInfoData list;
	initStringInfo(&list);
	for (const auto &n : names)
	{
		if (needed & n.mode)
			appendStringInfo(&list, "%s%s", list.len > 0 ? ", " : "", n.name);
	}
	const char *table =
	    quote_qualified_identifier(get_namespace_name(kt->catalog.namespace_oid), RelationGetRelationName(kt->rel));
	ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
	                errmsg("permission denied for table %s", RelationGetRelationName(kt->rel)),
	                errhint("%s needs %s on %s: GRANT %s ON %s TO %s (or to a role it inherits from; "
	                        "docs/security.md, \"Granting access\").",
	                        caller, list.data, table, list.data, table,
	                        quote_identifier(GetUserNameFromId(GetUserId(), false)))));
}

bool
keytable_open(KeyTable *kt, Access access, const char *caller)
{
	memset(kt, 0, sizeof(*kt));
	if (access != Access::read)
	{
		PreventCommandIfReadOnly(caller);
		PreventCommandIfParallelMode(caller);
	}
	kt->lockmode = access == Access::read ? AccessShareLock : RowExclusiveLock;
	open_table(kt, kt->lockmode);

	AclMode needed = privileges_for(access);
	if ((catalog_privileges(GetUserId()) & needed) != needed)
		missing_privileges(kt, needed, caller);

	rowsecurity_require_in_force(kt->rel, kt->catalog.namespace_oid);

	// This layer cannot evaluate row-level security policies: when they apply to the caller, the
	// caller takes the SQL path (policypath.hpp), where the executor applies them.
	if (kt->rel->rd_rel->relrowsecurity &&
	    check_enable_rls(RelationGetRelid(kt->rel), InvalidOid, false) == RLS_ENABLED)
	{
		table_close(kt->rel, NoLock);
		kt->rel = nullptr;
		return false;
	}

	if (access == Access::reap)
		kt->expiry = index_open(kt->catalog.expiry_oid, kt->lockmode);
	else
		kt->pkey = index_open(kt->catalog.pkey_oid, kt->lockmode);
	kt->found = table_slot_create(kt->rel, nullptr);
	return true;
}

void
keytable_prepare_write(KeyTable *kt)
{
	open_indexes(kt);
	// The insertions share one speculative-insertion token (keytable_before_wait).
	kt->share_token = true;
	// One scan of the primary key for all the look-ups, each a rescan: beginning and ending one per
	// key cost more than the look-up's descent.
	InitDirtySnapshot(kt->lookup_snapshot);
	kt->lookup_context = CurrentMemoryContext;
	kt->lookup = compat::begin_index_scan(kt->rel, kt->pkey, &kt->lookup_snapshot, 2, 0);
	for (int i = 0; i < kt->nindexes; i++)
	{
		const IndexInfo *info = kt->index_info[i];
		if (kt->estate == nullptr && (info->ii_Expressions != NIL || info->ii_Predicate != NIL))
			kt->estate = CreateExecutorState();
	}
}

void
keytable_clear(KeyTable *kt)
{
	ExecClearTuple(kt->found);
	if (kt->written != nullptr)
		ExecClearTuple(kt->written);
}

void
keytable_close(KeyTable *kt)
{
	keytable_before_wait(kt);
	if (kt->lookup != nullptr)
		index_endscan(kt->lookup);
	ExecDropSingleTupleTableSlot(kt->found);
	if (kt->written != nullptr)
		ExecDropSingleTupleTableSlot(kt->written);
	if (kt->estate != nullptr)
		FreeExecutorState(kt->estate);
	for (int i = 0; i < kt->nindexes; i++)
	{
		if (kt->indexes[i] != kt->pkey)
			index_close(kt->indexes[i], NoLock);
	}
	if (kt->pkey != nullptr)
		index_close(kt->pkey, NoLock);
	if (kt->expiry != nullptr)
		index_close(kt->expiry, NoLock);
	// Like the executor, keep the relation lock until the end of the transaction.
	table_close(kt->rel, NoLock);
}

static void
pkey_scankeys(KeyTable *kt, Datum scope, Datum key, ScanKeyData *keys)
{
	keys[0] = kt->catalog.pkey_scankey[0];
	keys[0].sk_argument = scope;
	keys[1] = kt->catalog.pkey_scankey[1];
	keys[1].sk_argument = key;
}

// Looks (scope, key) up in the primary key into kt->found, through the table's scan for many
// look-ups when it has one (a batch), else through one of its own. The table's scan runs in the
// memory it was begun in (the index access method keeps memory it allocates on the way, such as
// its list of dead entries, for the scan's life), and it is rescanned at the end, which lets go
// of the pages it pinned, as ending it would: no pin is held while waiting, nor between keys.
static bool
look_up(KeyTable *kt, Snapshot snapshot, ScanKey keys)
{
	if (kt->lookup == nullptr)
	{
		IndexScanDesc scan = compat::begin_index_scan(kt->rel, kt->pkey, snapshot, 2, 0);
		index_rescan(scan, keys, 2, nullptr, 0);
		bool found = index_getnext_slot(scan, ForwardScanDirection, kt->found);
		index_endscan(scan);
		return found;
	}
	MemoryContext old = MemoryContextSwitchTo(kt->lookup_context);
	index_rescan(kt->lookup, keys, 2, nullptr, 0);
	bool found = index_getnext_slot(kt->lookup, ForwardScanDirection, kt->found);
	index_rescan(kt->lookup, nullptr, 2, nullptr, 0);
	MemoryContextSwitchTo(old);
	return found;
}

// keytable_find_latest, waiting for other transactions until *deadline when one is given.
static Found
find_latest(KeyTable *kt, Datum scope, Datum key, const TimestampTz *deadline)
{
	ScanKeyData keys[2];
	pkey_scankeys(kt, scope, key, keys);
	SnapshotData own_dirty;
	Snapshot dirty = kt->lookup != nullptr ? &kt->lookup_snapshot : &own_dirty;
	InitDirtySnapshot(*dirty);

	for (;;)
	{
		if (!look_up(kt, dirty, keys))
			return Found::none;

		// Another transaction is inserting, updating or deleting this version: wait for its
		// decision (for a speculative insertion, just for that), then look again.
		TransactionId xwait = TransactionIdIsValid(dirty->xmin) ? dirty->xmin : dirty->xmax;
		if (!TransactionIdIsValid(xwait))
			return Found::row;
		ItemPointerData tid = kt->found->tts_tid;
		// Nothing pinned or held while waiting.
		ExecClearTuple(kt->found);
		keytable_before_wait(kt);
		// A speculative inserter holds its token only while it checks its index entries.
		if (dirty->speculativeToken != 0)
			SpeculativeInsertionWait(dirty->xmin, dirty->speculativeToken);
		else if (deadline == nullptr)
			XactLockTableWait(xwait, kt->rel, &tid, XLTW_InsertIndex);
		else if (!xact_wait_until(xwait, kt->rel, &tid, *deadline))
			return Found::busy;
		CHECK_FOR_INTERRUPTS();
	}
}

bool
keytable_find_latest(KeyTable *kt, Datum scope, Datum key)
{
	return find_latest(kt, scope, key, nullptr) == Found::row;
}

Found
keytable_find_latest_until(KeyTable *kt, Datum scope, Datum key, TimestampTz deadline)
{
	return find_latest(kt, scope, key, &deadline);
}


bool
keytable_find_visible(KeyTable *kt, Datum scope, Datum key, Snapshot snapshot)
{
	ScanKeyData keys[2];
	pkey_scankeys(kt, scope, key, keys);
	IndexScanDesc scan = compat::begin_index_scan(kt->rel, kt->pkey, snapshot, 2, 0);
	index_rescan(scan, keys, 2, nullptr, 0);
	bool found = index_getnext_slot(scan, ForwardScanDirection, kt->found);
	index_endscan(scan);
	return found;
}

bool
keytable_find_own_last(KeyTable *kt, Datum scope, Datum key)
{
	ItemPointerData tid;
	if (!writememo_find(kt, scope, key, &tid))
		return false;
	// Visible to a dirty snapshot and written by this transaction: not updated or deleted since,
	// nor rolled back with a subtransaction; nobody else can have a newer version of our row.
	SnapshotData dirty;
	InitDirtySnapshot(dirty);
	// Give the page the pruning an index fetch would (heap_fetch does none): without it the
	// versions that earlier completions left dead are not removed, and new keys go to new pages.
	// Before the fetch, since pruning may move tuples within the page.
	Buffer buffer = ReadBuffer(kt->rel, ItemPointerGetBlockNumber(&tid));
	heap_page_prune_opt(kt->rel, buffer);
	ReleaseBuffer(buffer);
	if (!table_tuple_fetch_row_version(kt->rel, &tid, &dirty, kt->found))
		return false;
	return TransactionIdIsCurrentTransactionId(keytable_found_xmin(kt));
}

bool
keytable_exists_now(KeyTable *kt, Datum scope, Datum key)
{
	Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
	bool found = keytable_find_visible(kt, scope, key, snapshot);
	ExecClearTuple(kt->found);
	UnregisterSnapshot(snapshot);
	return found;
}

void
keytable_read(KeyTable *kt, TupleTableSlot *slot, KeyRow *row)
{
	slot_getallattrs(slot);
	for (int c = 0; c < NUM_COLUMNS; c++)
	{
		int i = kt->catalog.attnum[c] - 1;
		row->value[c] = i < 0 ? (Datum) 0 : slot->tts_values[i];
		row->isnull[c] = i < 0 ? true : slot->tts_isnull[i];
	}
}

void
keytable_release_found(KeyTable *kt)
{
	ExecClearTuple(kt->found);
}

TransactionId
keytable_found_xmin(KeyTable *kt)
{
	bool isnull;
	return DatumGetTransactionId(slot_getsysattr(kt->found, MinTransactionIdAttributeNumber, &isnull));
}

bool
keytable_found_visible_to(KeyTable *kt, Snapshot snapshot)
{
	return table_tuple_satisfies_snapshot(kt->rel, kt->found, snapshot);
}

// Forms the tuple to write into kt->written. Columns that are not ours keep the values of `base`,
// the version being replaced, or are NULL in a new row; ours that the table lacks are skipped.
static void
store_written(KeyTable *kt, const KeyRow *row, TupleTableSlot *base)
{
	TupleDesc desc = RelationGetDescr(kt->rel);
	Datum *values = kt->written_values;
	bool *isnull = kt->written_isnull;
	if (base != nullptr)
	{
		slot_getallattrs(base);
		memcpy(values, base->tts_values, sizeof(Datum) * desc->natts);
		memcpy(isnull, base->tts_isnull, sizeof(bool) * desc->natts);
	}
	else
	{
		memset(values, 0, sizeof(Datum) * desc->natts);
		memset(isnull, true, sizeof(bool) * desc->natts);
	}
	for (int c = 0; c < NUM_COLUMNS; c++)
	{
		int i = kt->catalog.attnum[c] - 1;
		if (i < 0)
			continue;
		values[i] = row->value[c];
		isnull[i] = row->isnull[c];
	}
	ExecStoreHeapTuple(heap_form_tuple(desc, values, isnull), kt->written, true);
}

// The index entry's values for the tuple in kt->written; false when a partial index does not cover
// it. Plain column indexes (all of ours) take the columns the tuple was formed from
// (store_written), without deforming it, and need no executor state.
static bool
index_values(KeyTable *kt, int i, Datum *values, bool *isnull)
{
	IndexInfo *info = kt->index_info[i];
	TupleTableSlot *slot = kt->written;
	if (info->ii_Expressions == NIL && info->ii_Predicate == NIL)
	{
		for (int k = 0; k < info->ii_NumIndexAttrs; k++)
		{
			int column = info->ii_IndexAttrNumbers[k] - 1;
			values[k] = kt->written_values[column];
			isnull[k] = kt->written_isnull[column];
		}
		return true;
	}
	if (kt->estate == nullptr)
		kt->estate = CreateExecutorState();
	ExprContext *econtext = GetPerTupleExprContext(kt->estate);
	ResetExprContext(econtext);
	econtext->ecxt_scantuple = slot;
	if (info->ii_Predicate != NIL)
	{
		if (info->ii_PredicateState == nullptr)
			info->ii_PredicateState = ExecPrepareQual(info->ii_Predicate, kt->estate);
		if (!ExecQual(info->ii_PredicateState, econtext))
			return false;
	}
	FormIndexDatum(info, slot, kt->estate, values, isnull);
	return true;
}

// Adds the index entries of the tuple in kt->written, as ExecInsertIndexTuples does. With
// `speculative`, the primary key is checked without waiting or raising (UNIQUE_CHECK_PARTIAL), and
// false means a possible conflict there. With `summarizing_only`, only summarizing indexes (BRIN)
// get one: the update was HOT for the others.
static bool
insert_index_entries(KeyTable *kt, bool speculative, bool summarizing_only = false)
{
	TupleTableSlot *slot = kt->written;
	bool unique_ok = true;
	for (int i = 0; i < kt->nindexes; i++)
		compat::begin_row_index_inserts(kt->index_info[i]);
	for (int i = 0; i < kt->nindexes; i++)
	{
		Relation index = kt->indexes[i];
		if (!kt->index_info[i]->ii_ReadyForInserts)
			continue; // being built concurrently
		if (summarizing_only && !compat::index_summarizes(index))
			continue;
		Datum values[INDEX_MAX_KEYS];
		bool isnull[INDEX_MAX_KEYS];
		if (!index_values(kt, i, values, isnull))
			continue;
		bool is_pkey = index == kt->pkey;
		IndexUniqueCheck check = !index->rd_index->indisunique ? UNIQUE_CHECK_NO
		                         : (speculative && is_pkey)    ? UNIQUE_CHECK_PARTIAL
		                                                       : UNIQUE_CHECK_YES;
		// An update never changes (scope, key): tell the primary key, for bottom-up deletion.
		bool unchanged = !speculative && is_pkey;
		bool ok = index_insert(index, values, isnull, &slot->tts_tid, kt->rel, check, unchanged,
		                       kt->index_info[i]);
		if (check == UNIQUE_CHECK_PARTIAL && !ok)
			unique_ok = false;
	}
	for (int i = 0; i < kt->nindexes; i++)
		compat::end_row_index_inserts(kt->indexes[i], kt->index_info[i]);
	return unique_ok;
}

bool
keytable_insert(KeyTable *kt, const KeyRow *row)
{
	open_indexes(kt);
	store_written(kt, row, nullptr);
	TransactionId xid = GetCurrentTransactionId();
	// Others who find the tuple wait on this token for our decision, not on our transaction.
	uint32 token = kt->token != 0 ? kt->token : SpeculativeInsertionLockAcquire(xid);
	table_tuple_insert_speculative(kt->rel, kt->written, GetCurrentCommandId(true), 0, nullptr,
	                               token);
	bool inserted = insert_index_entries(kt, true);
	// Without a conflict the tuple becomes an ordinary one; with one it is killed, and nobody ever
	// sees two live versions of a key.
	table_tuple_complete_speculative(kt->rel, kt->written, token, inserted);
	if (kt->share_token)
		kt->token = token;
	else
		SpeculativeInsertionLockRelease(xid);
	if (inserted)
		writememo_remember(kt, row->value[COL_SCOPE], row->value[COL_KEY]);
	return inserted;
}

void
keytable_before_wait(KeyTable *kt)
{
	if (kt->token == 0)
		return;
	SpeculativeInsertionLockRelease(GetCurrentTransactionId());
	kt->token = 0;
}

TM_Result
keytable_update(KeyTable *kt, const KeyRow *row)
{
	open_indexes(kt);
	keytable_before_wait(kt); // the row's writer, if any
	ItemPointerData otid = kt->found->tts_tid;
	store_written(kt, row, kt->found);
	TM_FailureData tmfd;
	LockTupleMode lockmode;
	compat::NewIndexEntries entries;
	TM_Result result = compat::tuple_update(kt->rel, &otid, kt->written, GetCurrentCommandId(true),
	                                        statement_snapshot(), InvalidSnapshot, true, &tmfd,
	                                        &lockmode, &entries);
	switch (result)
	{
		case TM_Ok:
			// A HOT update needs no new index entries, but for summarizing indexes from 16.
			if (entries != compat::NewIndexEntries::none)
				insert_index_entries(kt, false, entries == compat::NewIndexEntries::summarizing_only);
			writememo_remember(kt, row->value[COL_SCOPE], row->value[COL_KEY]);
			return result;
		case TM_Updated:
		case TM_Deleted:
			return result;
		default:
			elog(ERROR, "idempotency: unexpected result %d updating idem_keys", (int) result);
	}
	pg_unreachable();
}

TM_Result
keytable_delete(KeyTable *kt)
{
	TM_FailureData tmfd;
	TM_Result result = table_tuple_delete(kt->rel, &kt->found->tts_tid, GetCurrentCommandId(true),
	                                      statement_snapshot(), InvalidSnapshot, true, &tmfd, false);
	switch (result)
	{
		case TM_Ok:
		case TM_Updated:
		case TM_Deleted:
			return result;
		default:
			elog(ERROR, "idempotency: unexpected result %d deleting from idem_keys", (int) result);
	}
	pg_unreachable();
}

bool
keytable_update_until(KeyTable *kt, const KeyRow *row, TimestampTz deadline, TM_Result *result)
{
	// Opened outside the subtransaction: its abort would close them under us; released there too,
	// as acquired.
	open_indexes(kt);
	keytable_before_wait(kt);
	auto update = [&] { *result = keytable_update(kt, row); };
	return with_lock_deadline(deadline, update);
}

bool
keytable_delete_unless_busy(KeyTable *kt)
{
	TM_FailureData tmfd;
	TM_Result result = table_tuple_delete(kt->rel, &kt->found->tts_tid, GetCurrentCommandId(true),
	                                      statement_snapshot(), InvalidSnapshot, false, &tmfd,
	                                      false);
	return result == TM_Ok;
}


Datum
keytable_found_datum(KeyTable *kt)
{
	return heap_copy_tuple_as_datum(ExecFetchSlotHeapTuple(kt->found, false, nullptr),
	                                RelationGetDescr(kt->rel));
}

Datum
keytable_written_datum(KeyTable *kt)
{
	return heap_copy_tuple_as_datum(ExecFetchSlotHeapTuple(kt->written, false, nullptr),
	                                RelationGetDescr(kt->rel));
}

} // namespace idem
