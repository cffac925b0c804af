// The key-state machine of docs/contract.md §2 and §9: claim, complete, fail, extend, release,
// forget, lookup and reap (core/keystate.cpp), and their batches (core/batch.cpp). Arguments arrive
// validated (api/); the rules are core/rules.cpp; rows are read and written through core/path.hpp,
// which chooses the way to the access layer (access/).
#pragma once

#include "access/keytable.hpp"
#include "common/pg.hpp"

namespace idem {

enum class Outcome
{
	claimed,
	replay,
	in_progress,
	count
};

struct ClaimInput
{
	Datum scope;              // text
	Datum key;                // text
	bool has_fingerprint;
	Datum fingerprint;        // bytea, when has_fingerprint: the caller's own
	Jsonb *request;           // fingerprinted by claim() when no fingerprint is given; or nullptr
	const Interval *ttl;      // nullptr: idempotency.default_ttl
	const Interval *lease;    // nullptr: idempotency.default_lease
	const Interval *wait;     // nullptr: NULL
	bool applied;             // a key this claim writes is written already completed (succeeded,
	                          // no response): for a caller that applies it in this transaction
};

// idem_claim_result, from the key's row after the claim.
struct ClaimOutput
{
	Outcome outcome;
	bool inserted;
	bool unseen;              // in_progress behind another transaction's uncommitted write:
	                          // no committed row to show, every column below NULL but
	                          // retry_after_s
	int32 attempt;
	Datum state;              // idem_state label
	bool response_null;
	Datum response;           // jsonb, a copy: it outlives the buffer it was read from
	bool response_code_null;
	int32 response_code;
	TimestampTz expires_at;
	Interval *retry_after;    // in_progress only
	int32 retry_after_s;      // in_progress only
	bool response_body_null;
	Datum response_body;      // bytea, a copy
	bool response_headers_null;
	Datum response_headers;   // jsonb, a copy
};

void claim(const ClaimInput *in, ClaimOutput *out);

// idem_claim_batch: many keys of one scope, each claimed by the rules of claim(). Keys arrive
// validated; `position` is what error messages call each one (its array subscript).
struct BatchClaimInput
{
	Datum scope;
	int nkeys;
	const Datum *keys;            // text
	const int *position;
	const bool *has_fingerprint;  // nullptr: none given
	const Datum *fingerprints;    // bytea
	const bool *request_null;     // nullptr: no requests; fingerprinted where no fingerprint is given
	const Datum *requests;        // jsonb
	const Interval *ttl;
	const Interval *lease;
	const Interval *wait;         // bounds the whole call, not each key
	bool applied;                 // ClaimInput::applied, for every key
};

// Called once per distinct key, in the order the keys are claimed, with the key's index in the
// input. `out` lives only during the call.
using BatchEmit = void (*)(void *arg, int index, const ClaimOutput *out);

void claim_batch(const BatchClaimInput *in, BatchEmit emit, void *arg);

// from + interval, which must be after `from` and at most 100 years later (22023 naming the
// argument otherwise). Checked against the real calendar: '-1 year 361 days' compares as positive
// (a month counts 30 days in interval comparison) yet ends in the past.
TimestampTz duration_end(TimestampTz from, const Interval *interval, const char *name);

struct FinishInput
{
	Datum scope;
	Datum key;
	KeyState to;              // STATE_SUCCEEDED (idem_complete) or STATE_FAILED (idem_fail)
	bool response_null;
	Datum response;           // jsonb
	int32 response_code;
	bool retryable;           // idem_fail only
	bool has_attempt;
	int32 attempt;
	const Interval *ttl;      // nullptr: expires_at unchanged
	bool body_null;
	Datum body;               // bytea
	bool headers_null;
	Datum headers;            // jsonb object
};

// Returns the finished row as a composite datum of idem_keys' row type.
Datum finish(const FinishInput *in);

// idem_complete_batch: finishes each key as finish() does (succeeded), all or nothing: the first
// key that cannot be finished raises, and the statement's error undoes the others.
struct BatchFinishInput
{
	Datum scope;
	int nkeys;
	const Datum *keys;            // text
	const int *position;
	const bool *has_attempt;      // nullptr: no fencing
	const int32 *attempts;
	const bool *response_null;    // nullptr: no responses
	const Datum *responses;       // jsonb
	int32 response_code;
	const Interval *ttl;
};

// Returns the number of keys finished.
int64 finish_batch(const BatchFinishInput *in);

// idem_extend (lease given) and idem_release (lease nullptr): the owner's new lease end.
struct LeaseInput
{
	Datum scope;
	Datum key;
	int32 attempt;
	const Interval *lease;    // nullptr: release, the lease ends now
};

// Returns the updated row as a composite datum of idem_keys' row type.
Datum set_lease(const LeaseInput *in);

// idem_forget: deletes the key whatever its state; a live lease only with `force` (IK005).
bool forget(Datum scope, Datum key, bool force);

// The row as the current snapshot sees it, or false (also for an expired key).
bool lookup(Datum scope, Datum key, Datum *row);

int64 reap(int32 max_rows);

} // namespace idem
