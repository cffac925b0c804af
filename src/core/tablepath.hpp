// The key's rules (core/rules.hpp) on the table access layer (access/keytable.hpp), with no
// executor, SPI or SQL: the way to idem_keys when row-level security does not apply to the caller.
// core/path.hpp chooses it; `kt` is open (keytable_open returned true).
#pragma once

#include "core/rules.hpp"
#include "core/wait.hpp"

namespace idem {

// Claims one key, inserting before looking when the backend's last claim created its key.
void table_claim(KeyTable *kt, const ClaimInput *in, Waiter *waiter, ClaimOutput *out);

// A batch's guess, key by key, whether the next key is new. A wrong insert-first (the key exists)
// costs a killed heap tuple, a primary-key entry and a BRIN look-up before the look-up, about
// twice what a wrong look-first (the key is new) costs; so inserting first pays while more than
// two thirds of the keys are new. The batch inserts first while the key before was new and at
// least two thirds of its keys so far were: a run of new keys (a fresh poll) inserts without a
// look-up, a run of applied ones (a redelivery) looks without writing after its first, and ids
// half new and half applied in no order (random ids of a partly redelivered poll) look first
// instead of paying a killed insertion for every applied id that follows a new one. Its first key
// follows the backend's last claim.
struct BatchGuess
{
	int created;
	int existing;
	bool insert_first;

	void note(bool key_created)
	{
		(key_created ? created : existing)++;
		insert_first = key_created && created >= 2 * existing;
	}
};


// A batch's first guess follows the backend's last claim; after the batch, its last guess is
// the backend's.
void table_batch_guess_begin(BatchGuess *guess);
void table_batch_claim(KeyTable *kt, BatchGuess *guess, const ClaimInput *in, Waiter *waiter,
                       ClaimOutput *out);
void table_batch_guess_end(const BatchGuess *guess);

// Changes the key's current row with change(arg, row), as UPDATE ... WHERE key = ... would;
// returns the written row as a composite datum of idem_keys' row type. IK003 when there is none.
Datum table_update(KeyTable *kt, Datum scope, Datum key, RowChange change, void *arg);

// Deletes the key's current row after check(arg, row); false when there is none.
bool table_delete(KeyTable *kt, Datum scope, Datum key, RowCheck check, void *arg);

// The row as the current snapshot sees it, or false (also for an expired key).
bool table_lookup(KeyTable *kt, Datum scope, Datum key, Datum *row);

// Deletes up to max_rows expired keys that no other transaction holds.
int64 table_reap(KeyTable *kt, int32 max_rows);

} // namespace idem
