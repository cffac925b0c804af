// The table access layer: idem_keys and its indexes through PostgreSQL's table and index access
// methods, with no executor, SPI or SQL. It knows rows and versions, not key states: the rules of
// claim/complete/fail/reap live in core/rules.cpp. Its memo of the backend's last writes is
// access/writememo.hpp, the expiry scan access/expiry.hpp.
#pragma once

#include "access/catalog.hpp"
#include "common/pg.hpp"

namespace idem {

// One row's public columns.
struct KeyRow
{
	Datum value[NUM_COLUMNS];
	bool isnull[NUM_COLUMNS];
};

struct KeyTable
{
	Catalog catalog; // a copy: an invalidation during the call must not change it under us
	Relation rel;
	Relation pkey;   // for finding a key
	Relation expiry; // for reaping
	LOCKMODE lockmode;
	int nindexes;
	Relation *indexes;
	IndexInfo **index_info;
	TupleTableSlot *found;   // the version last found, pinned (buffer heap slot)
	TupleTableSlot *written; // the tuple being inserted or written as an update
	Datum *written_values;   // its columns, while it is formed
	bool *written_isnull;
	EState *estate;          // only for indexes with expressions or predicates
	IndexScanDesc lookup;    // the primary key's scan reused by a batch's look-ups (or null)
	SnapshotData lookup_snapshot; // its dirty snapshot
	MemoryContext lookup_context; // and the memory it runs in
	bool share_token;        // a batch: its insertions share one speculative-insertion token
	uint32 token;            // that token while held (0: none)
};

enum class Access
{
	read,  // idem_lookup: SELECT
	write,  // claim, complete, fail: SELECT, INSERT, UPDATE
	update, // extend, release: SELECT, UPDATE (UPDATE ... WHERE key = ...)
	forget, // idem_forget: SELECT, DELETE (DELETE ... WHERE key = ... reads the key)
	reap,   // idem_reap: DELETE
};

// Opens idem_keys and, for writers, its indexes; checks privileges as the equivalent SQL would and
// refuses a read-only transaction for writers (25006). False, with only kt->catalog set, when
// row-level security applies to the caller: then use the SQL path of policypath.hpp.
bool keytable_open(KeyTable *kt, Access access, const char *caller);
void keytable_close(KeyTable *kt);

// Opens what writes need (the indexes, and executor state for indexes with expressions or
// predicates) now, in the current memory context, rather than on the first write, a scan of the
// primary key that every look-up until keytable_close reuses, and one speculative-insertion token
// for its insertions (keytable_before_wait): a caller that
// writes many keys in a short-lived context per key (a batch) calls this first. Between keys it
// calls keytable_clear, which drops what the slots hold.
void keytable_prepare_write(KeyTable *kt);
void keytable_clear(KeyTable *kt);

// Finds the newest version of (scope, key) that is or may become live, as INSERT ... ON CONFLICT's
// pre-check does: SnapshotDirty over the primary key, waiting out any other transaction that is
// inserting, updating or deleting it, then looking again. True with the version in kt->found.
bool keytable_find_latest(KeyTable *kt, Datum scope, Datum key);

// keytable_find_latest with waits for other transactions that end at `deadline`: busy when one
// still holds the key then. A deadline already passed never blocks.
enum class Found
{
	none,
	row,
	busy,
};
Found keytable_find_latest_until(KeyTable *kt, Datum scope, Datum key, TimestampTz deadline);

// keytable_find_latest for a key this transaction wrote last, or in its last batch of claims,
// without the index: true with that version in kt->found when it is still the newest one (the
// common claim-then-complete in one transaction); false means "use keytable_find_latest".
bool keytable_find_own_last(KeyTable *kt, Datum scope, Datum key);

// Finds (scope, key) as an MVCC snapshot sees it. True with the version in kt->found.
bool keytable_find_visible(KeyTable *kt, Datum scope, Datum key, Snapshot snapshot);

// Whether (scope, key) has a committed version now, by a fresh snapshot. keytable_find_latest can
// miss a key whose old version dies while its scan runs: the btree scan reads a leaf page's entries
// at once, so the new version's entry, added after that, is not among them. A snapshot taken after
// that scan sees the new version, and its index entry.
bool keytable_exists_now(KeyTable *kt, Datum scope, Datum key);

void keytable_read(KeyTable *kt, TupleTableSlot *slot, KeyRow *row);
// Forgets the version in kt->found, dropping its buffer pin (before a sleep).
void keytable_release_found(KeyTable *kt);
TransactionId keytable_found_xmin(KeyTable *kt);
bool keytable_found_visible_to(KeyTable *kt, Snapshot snapshot);

// Inserts the row with the speculative-insertion protocol. False when a concurrent insert of the
// same key won the race: the row was killed and the caller looks again.
bool keytable_insert(KeyTable *kt, const KeyRow *row);

// A batch (keytable_prepare_write) keeps the speculative-insertion token of its first insertion
// for the next ones: acquiring and releasing one per row costs about 5 % of a new key. Whoever
// found one of its rows while it was being inserted waits for the token's release rather than for
// that row's decision, so the batch must let go of it before it waits for anything itself (a
// transaction, a lease, a tuple lock), or two batches could wait for each other: this call,
// which the layer's own waits make too. Released at keytable_close.
void keytable_before_wait(KeyTable *kt);

// Replaces the version in kt->found with the row, waiting for concurrent writers of it.
// TM_Ok, or TM_Updated / TM_Deleted when that version is no longer the newest.
TM_Result keytable_update(KeyTable *kt, const KeyRow *row);

// keytable_update with its waits for concurrent writers ending at `deadline`: false, with nothing
// written, when one still holds the row then (see access/lockwait.hpp: at least 1 ms).
bool keytable_update_until(KeyTable *kt, const KeyRow *row, TimestampTz deadline, TM_Result *result);

// Deletes the version in kt->found, waiting for a concurrent writer of it. TM_Ok, or TM_Updated /
// TM_Deleted when that version is no longer the newest.
TM_Result keytable_delete(KeyTable *kt);

// Deletes the version in kt->found unless another transaction holds or changed it: never waits.
bool keytable_delete_unless_busy(KeyTable *kt);

// The version in kt->found, or the tuple last written, as a composite datum of idem_keys' row type.
Datum keytable_found_datum(KeyTable *kt);
Datum keytable_written_datum(KeyTable *kt);

} // namespace idem
