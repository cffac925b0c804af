// The key's rules (docs/contract.md §2 and §9): what a claim decides on an existing row, the rows
// that a claim, a finish or a lease change writes, when a key counts as expired, and the answers.
// They read and change KeyRows and never touch the table: both paths to idem_keys
// (core/tablepath.cpp, core/sqlpath.cpp) and the batches (core/batch.cpp) apply these same rules.
#pragma once

#include "core/keystate.hpp"

namespace idem {

// Leases and expiry are wall-clock time, not the transaction's start.
inline TimestampTz
clock_now()
{
	return GetCurrentTimestamp();
}

TimestampTz add_interval(TimestampTz t, const Interval *interval);

const char *key_text(Datum key);
bool bytea_equal(Datum a, Datum b);

inline bool
row_in_state(const Catalog *c, const KeyRow *row, KeyState state)
{
	return DatumGetObjectId(row->value[COL_STATE]) == c->state_label[state];
}

inline void
set_state(const Catalog *c, KeyRow *row, KeyState state)
{
	row->value[COL_STATE] = ObjectIdGetDatum(c->state_label[state]);
	row->isnull[COL_STATE] = false;
}

inline void
set_timestamp(KeyRow *row, Column c, TimestampTz t)
{
	row->value[c] = TimestampTzGetDatum(t);
	row->isnull[c] = false;
}

inline void
set_null(KeyRow *row, Column c)
{
	row->value[c] = (Datum) 0;
	row->isnull[c] = true;
}

inline bool
live_lease(const Catalog *c, const KeyRow *row, TimestampTz now)
{
	return row_in_state(c, row, STATE_PENDING) && !row->isnull[COL_LOCKED_UNTIL] &&
	       DatumGetTimestampTz(row->value[COL_LOCKED_UNTIL]) > now;
}

// docs/contract.md §9.1: past expires_at and nobody working on it. Every function treats such a key
// as absent, whether or not the reaper has deleted it yet.
inline bool
expired(const Catalog *c, const KeyRow *row, TimestampTz now)
{
	return DatumGetTimestampTz(row->value[COL_EXPIRES_AT]) <= now && !live_lease(c, row, now);
}

// When the attempt on the row was claimed, for its claim-to-finish time (0: not recorded, a key
// claimed before 1.2).
inline TimestampTz
attempt_claimed_at(const KeyRow *row)
{
	return row->isnull[COL_CLAIMED_AT] ? 0 : DatumGetTimestampTz(row->value[COL_CLAIMED_AT]);
}

void serialization_failure(const char *what);

// The row a claim writes for a key that is new (or expired: claimed anew in place).
void new_row(const Catalog *c, const ClaimInput *in, TimestampTz now, KeyRow *row);

// A new lease on an abandoned or retryable key: the fencing token moves on, the old outcome goes.
void takeover_row(const Catalog *c, const ClaimInput *in, TimestampTz now, KeyRow *row);

enum class Step
{
	owned,       // this transaction wrote the row
	expired,     // as if absent: claimed anew in place
	replay,      // finished for good
	in_progress, // someone else's live lease
	takeover,    // abandoned lease or retryable failure
};

// docs/contract.md §2 steps 3 to 7 for an existing row; raises IK001 on a fingerprint mismatch.
Step decide(const Catalog *c, const KeyRow *row, const ClaimInput *in, bool own, TimestampTz now);

// The claim's answer from the key's row, counted in the statistics.
void answer(const Catalog *c, Outcome outcome, bool inserted, const KeyRow *row, ClaimOutput *out);

// The outcome of a step that writes nothing.
void answer_read(const Catalog *c, Step step, const KeyRow *row, TimestampTz now, ClaimOutput *out);

// `wait` ran out while another transaction still held the key uncommitted.
void answer_unseen(Datum scope, ClaimOutput *out);

// IK003.
void key_not_found(Datum key);

// complete/fail on the key's current row.
void finish_row(const Catalog *c, const FinishInput *in, KeyRow *row);

// extend/release on the key's current row.
void lease_row(const Catalog *c, const LeaseInput *in, KeyRow *row);

// idem_forget refuses a key someone is working on right now, unless forced.
void check_forgettable(const Catalog *c, Datum key, bool force, const KeyRow *row);

// A rule applied to the key's current row before it is written (complete, fail, extend,
// release: it checks the row, may raise, and changes it), or before it is deleted (forget: it
// checks the row and may raise). `arg` is the caller's.
using RowChange = void (*)(void *arg, KeyRow *row);
using RowCheck = void (*)(void *arg, const KeyRow *row);

// The request's fingerprint in the form the installed version stores.
void fingerprint_request(const Catalog *c, ClaimInput *in);

} // namespace idem
