// A memo of where this backend last wrote idem_keys: the row version of its last write, and the
// versions of its last batch of claims, so that completing a key claimed in the same transaction
// finds its row without the primary key (keytable_find_own_last). It remembers places, never
// reads the table.
#pragma once

#include "access/keytable.hpp"

namespace idem {

// At load time: forget the row version this backend wrote last when its subtransaction aborts.
void writememo_register_callbacks();

// The version just written into kt->written (an insertion or an update) of (scope, key).
void writememo_remember(KeyTable *kt, Datum scope, Datum key);

// Whether the key is the one this transaction wrote last (in this backend, not rolled back with a
// subtransaction); reads nothing.
bool keytable_wrote_last(KeyTable *kt, Datum scope, Datum key);

// A batch of claims in key order: keytable_batch_begin before the first, keytable_batch_note after
// each claim (it remembers where the key was written, if the claim wrote it), so that
// keytable_find_own_last finds the batch's keys too (a batch completed in the same transaction).
void keytable_batch_begin(KeyTable *kt, Datum scope, int nkeys);
void keytable_batch_note(KeyTable *kt, Datum scope, Datum key);

// Where this transaction wrote (scope, key) last, if the memo knows: its last write, or its last
// batch of claims.
bool writememo_find(KeyTable *kt, Datum scope, Datum key, ItemPointerData *tid);

} // namespace idem
