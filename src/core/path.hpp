// The one place that chooses the way to idem_keys for a call. keytable_open decides: the table
// access layer (core/tablepath.hpp) unless row-level security applies to the caller, then SQL,
// where the executor applies the policies (core/sqlpath.hpp). The entry points (core/keystate.cpp,
// core/batch.cpp) open a KeyPath, act through it and close it, whichever way it goes.
#pragma once

#include "core/tablepath.hpp"

namespace idem {

struct KeyPath
{
	KeyTable kt;       // its catalog on both ways; the rest on the table path only
	bool direct;       // the table path
	bool batch_claims; // path_batch_claims_begin was called
	bool remember;     // and the batch's writes are remembered (keytable_batch_note)
	BatchGuess guess;  // the batch's guess whether its next key is new (table path)
};

// Opens idem_keys for `access` (access/keytable.hpp) and chooses the way; returns the catalog.
const Catalog *path_open(KeyPath *p, Access access, const char *caller);
void path_close(KeyPath *p);

void path_claim(KeyPath *p, const ClaimInput *in, Waiter *waiter, ClaimOutput *out);

// A batch opens what writes need once (keytable_prepare_write) and calls path_batch_next between
// keys; a batch of claims also calls path_batch_claims_begin, then path_batch_claim per key.
// `remember`: where each key is written is remembered, for its completion in this transaction.
void path_batch_begin(KeyPath *p);
void path_batch_claims_begin(KeyPath *p, Datum scope, int nkeys, bool remember);
void path_batch_claim(KeyPath *p, const ClaimInput *in, Waiter *waiter, ClaimOutput *out);
void path_batch_next(KeyPath *p);

// The key's current row changed by change(arg, row), as UPDATE ... WHERE key = ... would; the
// written row as a composite datum of idem_keys' row type. IK003 when there is no row.
Datum path_update(KeyPath *p, Datum scope, Datum key, RowChange change, void *arg);
// The key's current row deleted after check(arg, row); false when there is no row.
bool path_delete(KeyPath *p, Datum scope, Datum key, RowCheck check, void *arg);

// The same with a lambda that takes the row.
template <typename Change>
inline Datum
path_update(KeyPath *p, Datum scope, Datum key, Change &change)
{
	return path_update(p, scope, key, +[](void *arg, KeyRow *row) { (*static_cast<Change *>(arg))(row); },
	                   &change);
}

template <typename Check>
inline bool
path_delete(KeyPath *p, Datum scope, Datum key, Check &check)
{
	return path_delete(p, scope, key, +[](void *arg, const KeyRow *row) { (*static_cast<Check *>(arg))(row); },
	                   &check);
}

// The row as the current snapshot sees it, or false (also for an expired key).
bool path_lookup(KeyPath *p, Datum scope, Datum key, Datum *row);

// Deletes up to max_rows expired keys; the number deleted.
int64 path_reap(KeyPath *p, int32 max_rows);

} // namespace idem
