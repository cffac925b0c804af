#include "access/writememo.hpp"

#include "common/compat.hpp"

namespace idem {

// The row version this backend wrote last: its table's storage, transaction, place and key.
// Forgotten when a subtransaction aborts (the version may then be vacuumed away, page and all);
// a new transaction or new storage (TRUNCATE in this transaction) no longer matches.
static struct
{
	Oid relid;
	compat::Storage storage;
	TransactionId xid;
	ItemPointerData tid;
	int scope_len;
	int key_len;
	char bytes[2048 + 256]; // scope then key; longer ones are not remembered
} own_last;

// The versions this transaction wrote in its last batch of claims, in key order (the order a
// batch takes its keys in), so that completing the batch in the same transaction finds them
// without the index, as own_last does for one key. Kept in TopTransactionContext; forgotten like
// own_last, and at the end of the transaction.
static struct
{
	Oid relid;
	compat::Storage storage;
	TransactionId xid;
	text *scope;
	int n;
	int capacity;
	text **keys;
	ItemPointerData *tids;
} batch_written;

static void
forget_written(SubXactEvent event, SubTransactionId, SubTransactionId, void *)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
	{
		own_last.relid = InvalidOid;
		batch_written.relid = InvalidOid;
	}
}

static void
forget_batch_written(XactEvent, void *)
{
	// Its memory goes with the transaction's.
	batch_written.relid = InvalidOid;
	batch_written.keys = nullptr;
	batch_written.tids = nullptr;
}

void
writememo_register_callbacks()
{
	RegisterSubXactCallback(forget_written, nullptr);
	RegisterXactCallback(forget_batch_written, nullptr);
}

void
writememo_remember(KeyTable *kt, Datum scope, Datum key)
{
	text *s = DatumGetTextPP(scope);
	text *k = DatumGetTextPP(key);
	int slen = VARSIZE_ANY_EXHDR(s), klen = VARSIZE_ANY_EXHDR(k);
	own_last.relid = InvalidOid;
	if (slen + klen > (int) sizeof(own_last.bytes))
		return;
	memcpy(own_last.bytes, VARDATA_ANY(s), slen);
	memcpy(own_last.bytes + slen, VARDATA_ANY(k), klen);
	own_last.scope_len = slen;
	own_last.key_len = klen;
	own_last.tid = kt->written->tts_tid;
	own_last.xid = GetTopTransactionId();
	own_last.storage = compat::storage_of(kt->rel);
	own_last.relid = RelationGetRelid(kt->rel);
}

bool
keytable_wrote_last(KeyTable *kt, Datum scope, Datum key)
{
	if (own_last.relid != RelationGetRelid(kt->rel) || own_last.xid != GetTopTransactionIdIfAny() ||
	    !compat::same_storage(own_last.storage, compat::storage_of(kt->rel)))
		return false;
	text *s = DatumGetTextPP(scope);
	text *k = DatumGetTextPP(key);
	return (int) VARSIZE_ANY_EXHDR(s) == own_last.scope_len && (int) VARSIZE_ANY_EXHDR(k) == own_last.key_len &&
	       memcmp(own_last.bytes, VARDATA_ANY(s), own_last.scope_len) == 0 &&
	       memcmp(own_last.bytes + own_last.scope_len, VARDATA_ANY(k), own_last.key_len) == 0;
}

static int
compare_bytes(const char *a, int alen, const char *b, int blen)
{
	int c = memcmp(a, b, Min(alen, blen));
	return c != 0 ? c : (alen > blen) - (alen < blen);
}

void
keytable_batch_begin(KeyTable *kt, Datum scope, int nkeys)
{
	MemoryContext old = MemoryContextSwitchTo(TopTransactionContext);
	batch_written.relid = InvalidOid;
	batch_written.scope = DatumGetTextPCopy(scope);
	batch_written.n = 0;
	batch_written.capacity = nkeys;
	batch_written.keys = (text **) palloc(sizeof(text *) * Max(nkeys, 1));
	batch_written.tids = (ItemPointerData *) palloc(sizeof(ItemPointerData) * Max(nkeys, 1));
	MemoryContextSwitchTo(old);
	batch_written.xid = GetTopTransactionIdIfAny();
	batch_written.storage = compat::storage_of(kt->rel);
	batch_written.relid = RelationGetRelid(kt->rel);
}

void
keytable_batch_note(KeyTable *kt, Datum scope, Datum key)
{
	if (batch_written.relid != RelationGetRelid(kt->rel) || batch_written.n >= batch_written.capacity ||
	    !keytable_wrote_last(kt, scope, key))
		return;
	// The batch began before its first write gave the transaction an id.
	if (!TransactionIdIsValid(batch_written.xid))
		batch_written.xid = own_last.xid;
	if (batch_written.xid != own_last.xid)
		return;
	text *k = DatumGetTextPP(key);
	if (batch_written.n > 0)
	{
		const text *prev = batch_written.keys[batch_written.n - 1];
		if (compare_bytes(VARDATA_ANY(prev), VARSIZE_ANY_EXHDR(prev), VARDATA_ANY(k), VARSIZE_ANY_EXHDR(k)) >= 0)
			return; // not in key order: left to the index
	}
	batch_written.keys[batch_written.n] =
	    (text *) MemoryContextAlloc(TopTransactionContext, VARSIZE_ANY(k));
	memcpy(batch_written.keys[batch_written.n], k, VARSIZE_ANY(k));
	batch_written.tids[batch_written.n] = own_last.tid;
	batch_written.n++;
}

// Where the last batch of claims wrote (scope, key), if it did, in this transaction.
static bool
batch_wrote(KeyTable *kt, Datum scope, Datum key, ItemPointerData *tid)
{
	if (batch_written.relid != RelationGetRelid(kt->rel) || batch_written.xid != GetTopTransactionIdIfAny() ||
	    !compat::same_storage(batch_written.storage, compat::storage_of(kt->rel)))
		return false;
	text *s = DatumGetTextPP(scope);
	const text *bs = batch_written.scope;
	if (compare_bytes(VARDATA_ANY(s), VARSIZE_ANY_EXHDR(s), VARDATA_ANY(bs), VARSIZE_ANY_EXHDR(bs)) != 0)
		return false;
	text *k = DatumGetTextPP(key);
	int lo = 0, hi = batch_written.n - 1;
	while (lo <= hi)
	{
		int mid = lo + (hi - lo) / 2;
		const text *m = batch_written.keys[mid];
		int c = compare_bytes(VARDATA_ANY(k), VARSIZE_ANY_EXHDR(k), VARDATA_ANY(m), VARSIZE_ANY_EXHDR(m));
		if (c == 0)
		{
			*tid = batch_written.tids[mid];
			return true;
		}
		if (c < 0)
			hi = mid - 1;
		else
			lo = mid + 1;
	}
	return false;
}

bool
writememo_find(KeyTable *kt, Datum scope, Datum key, ItemPointerData *tid)
{
	if (keytable_wrote_last(kt, scope, key))
	{
		*tid = own_last.tid;
		return true;
	}
	return batch_wrote(kt, scope, key, tid);
}

} // namespace idem
