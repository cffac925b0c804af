#include "stats/scopestats.hpp"

#include "common/compat.hpp"

#include "common/settings.hpp"
#include "stats/dbstats.hpp"

extern "C" {
#include "common/hashfn.h"
#include "port/atomics.h"
#include "port/pg_bitutils.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/hsearch.h"
}

#include <algorithm>
#include <cmath>

namespace idem {

// The shape, after pg_stat_statements: a shared hash from (database, scope) to an entry, under one
// LWLock. Counting takes it shared (claimers never wait on each other for a known scope);
// creating and evicting an entry take it exclusive. The entry's counts do not live in the hash
// entry but in a cache-line-aligned slot of a separate array, split into stripes: a backend adds
// (atomically) to the stripe its process number picks, so that 64 backends claiming in ONE scope
// spread over the stripes' cache lines instead of all writing one; a reader sums the stripes.
//
// Claim-to-finish times go to log-scale histograms (4 buckets per power of two of microseconds,
// each about 19 % wide: a percentile is the bucket's middle, within ±10 %) in two windows of
// window_us that take turns: the percentiles cover the last one to two windows.
//
// Eviction: when a new entry finds the table full, the least used 5 % go (at least one). An
// entry's usage is its activity (claims and finishes) since the previous eviction plus its usage
// then times 0.99 (pg_stat_statements' decay): activity long ago fades, so a scope busy once does
// not hold its entry for ever, yet a run of one-claim scopes does not push out a busy one.
// Computed from the counters during the eviction, so counting writes no usage field.
static constexpr int max_scope_bytes = 255; // docs/contract.md §4
static constexpr int stripes = 4;
static constexpr int buckets_per_octave = 4;
static constexpr int num_buckets = 32 * buckets_per_octave; // 1 µs to 2^32 µs (71 minutes)
static constexpr int64 window_us = 60 * USECS_PER_SEC;
static constexpr double evict_fraction = 0.05;
static constexpr double usage_decay = 0.99;
// Fewer finished attempts in the windows than this: the scope's work time is not known yet.
static constexpr uint64 min_samples_for_estimate = 5;
static constexpr const char *tranche_name = "idempotency scope stats";

struct ScopeKey
{
	Oid dboid;
	uint32 len;
	char scope[max_scope_bytes]; // len bytes used
};

struct ScopeEntry
{
	ScopeKey key; // first: the hash key
	int slot;     // index into ScopeShared's data
	// Eviction bookkeeping, under the exclusive lock only.
	uint64 activity_seen;
	double usage;
};

// The counters and the work-time histograms of an entry live in two arrays: every claim writes a
// counter, only finishes write a histogram, and keeping the counters of all entries together
// (576 bytes an entry, against 4 kB of histograms) keeps what claims touch in few cache lines and
// few pages (each new backend takes a page fault on the first touch of each page).
struct alignas(PG_CACHE_LINE_SIZE) Stripe
{
	pg_atomic_uint64 count[scope_counter_count];
};

struct alignas(PG_CACHE_LINE_SIZE) ScopeData
{
	pg_atomic_uint64 window_epoch[2]; // which window each histogram holds (time / window_us)
	Stripe stripe[stripes];
};

struct alignas(PG_CACHE_LINE_SIZE) HistogramStripe
{
	pg_atomic_uint32 bucket[2][num_buckets];
};

struct ScopeTimes
{
	HistogramStripe stripe[stripes];
};

struct ScopeShared
{
	LWLock *lock;
	int max_entries;
	int next_unused; // data slots never used yet start here
	int nfree;       // data slots of removed entries, in free_slot[0 .. nfree)
	ScopeData *data;   // max_entries of them, cache-line aligned
	ScopeTimes *times; // max_entries of them, after data; times[i] belongs to data[i]
	int free_slot[FLEXIBLE_ARRAY_MEMBER];
};

static ScopeShared *shared = nullptr;
static HTAB *scopes = nullptr;
static shmem_request_hook_type prev_shmem_request_hook = nullptr;
static shmem_startup_hook_type prev_shmem_startup_hook = nullptr;

static Size
header_size(int max_entries)
{
	return add_size(offsetof(ScopeShared, free_slot), mul_size(sizeof(int), max_entries));
}

static Size
data_size(int max_entries)
{
	return add_size(mul_size(sizeof(ScopeData) + sizeof(ScopeTimes), max_entries), PG_CACHE_LINE_SIZE);
}

static uint32
scope_key_hash(const void *key, Size)
{
	const ScopeKey *k = static_cast<const ScopeKey *>(key);
	return hash_combine(hash_bytes_uint32(k->dboid),
	                    hash_bytes(reinterpret_cast<const unsigned char *>(k->scope), static_cast<int>(k->len)));
}

static int
scope_key_match(const void *a, const void *b, Size)
{
	const ScopeKey *x = static_cast<const ScopeKey *>(a);
	const ScopeKey *y = static_cast<const ScopeKey *>(b);
	return x->dboid == y->dboid && x->len == y->len && memcmp(x->scope, y->scope, x->len) == 0 ? 0 : 1;
}

static void
scope_shmem_request()
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	int n = setting_track_scopes;
	RequestAddinShmemSpace(add_size(add_size(MAXALIGN(header_size(n)), data_size(n)),
	                                hash_estimate_size(n, sizeof(ScopeEntry))));
	RequestNamedLWLockTranche(tranche_name, 1);
}

static void
scope_shmem_startup()
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	int n = setting_track_scopes;
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	bool found;
	shared = static_cast<ScopeShared *>(ShmemInitStruct("idempotency scope stats", header_size(n), &found));
	if (!found)
	{
		bool data_found;
		void *data = ShmemInitStruct("idempotency scope stats data", data_size(n), &data_found);
		shared->lock = &(GetNamedLWLockTranche(tranche_name))->lock;
		shared->max_entries = n;
		shared->next_unused = 0;
		shared->nfree = 0;
		shared->data = reinterpret_cast<ScopeData *>(CACHELINEALIGN(data));
		shared->times = reinterpret_cast<ScopeTimes *>(shared->data + n);
	}
	HASHCTL info;
	info.keysize = sizeof(ScopeKey);
	info.entrysize = sizeof(ScopeEntry);
	info.hash = scope_key_hash;
	info.match = scope_key_match;
	scopes = compat::init_shmem_hash("idempotency scope stats hash", n, &info,
	                                 HASH_ELEM | HASH_FUNCTION | HASH_COMPARE);
	LWLockRelease(AddinShmemInitLock);
}

void
scope_stats_request_shmem()
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = scope_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = scope_shmem_startup;
}

// The key of `scope` in this database; false for a scope longer than any claim accepts.
static bool
make_key(Datum scope, ScopeKey *key)
{
	text *t = DatumGetTextPP(scope);
	Size len = VARSIZE_ANY_EXHDR(t);
	if (len > max_scope_bytes)
		return false;
	key->dboid = MyDatabaseId;
	key->len = static_cast<uint32>(len);
	memcpy(key->scope, VARDATA_ANY(t), len);
	return true;
}

static ScopeTimes *
times_of(ScopeData *d)
{
	return &shared->times[d - shared->data];
}

static void
data_init(ScopeData *d)
{
	for (int w = 0; w < 2; w++)
		pg_atomic_init_u64(&d->window_epoch[w], 0); // epoch 0 (1970) is never a current window
	for (Stripe &s : d->stripe)
		for (pg_atomic_uint64 &c : s.count)
			pg_atomic_init_u64(&c, 0);
	for (HistogramStripe &h : times_of(d)->stripe)
		for (auto &window : h.bucket)
			for (pg_atomic_uint32 &b : window)
				pg_atomic_init_u32(&b, 0);
}

static uint64
sum_count(ScopeData *d, Counter c)
{
	uint64 total = 0;
	for (Stripe &s : d->stripe)
		total += pg_atomic_read_u64(&s.count[static_cast<int>(c)]);
	return total;
}

static uint64
activity(ScopeData *d)
{
	return sum_count(d, Counter::claims) + sum_count(d, Counter::completes) +
	       sum_count(d, Counter::fails) + sum_count(d, Counter::releases);
}

static void
remove_entry(ScopeEntry *e)
{
	shared->free_slot[shared->nfree++] = e->slot;
	hash_search(scopes, &e->key, HASH_REMOVE, nullptr);
}

// The table is full: remove the least used entries. Exclusive lock held.
static void
evict()
{
	long n = hash_get_num_entries(scopes);
	ScopeEntry **entries = static_cast<ScopeEntry **>(palloc(n * sizeof(ScopeEntry *)));
	HASH_SEQ_STATUS seq;
	hash_seq_init(&seq, scopes);
	long i = 0;
	for (ScopeEntry *e; (e = static_cast<ScopeEntry *>(hash_seq_search(&seq))) != nullptr;)
	{
		uint64 now = activity(&shared->data[e->slot]);
		e->usage = e->usage * usage_decay + static_cast<double>(now - e->activity_seen);
		e->activity_seen = now;
		entries[i++] = e;
	}
	std::sort(entries, entries + n, [](const ScopeEntry *a, const ScopeEntry *b) { return a->usage < b->usage; });
	long victims = Max(1L, static_cast<long>(n * evict_fraction));
	for (i = 0; i < victims && i < n; i++)
	{
		Oid dboid = entries[i]->key.dboid;
		remove_entry(entries[i]);
		db_stats_dealloc(dboid, 1);
	}
	pfree(entries);
}

// The entry's data slot for `key`, created when missing (evicting if full). Returns with the lock
// held (shared, or exclusive when it created the entry); nullptr (lock released) when there is no
// room even after eviction.
static ScopeData *
find_or_create(const ScopeKey *key, uint32 hash)
{
	LWLockAcquire(shared->lock, LW_SHARED);
	ScopeEntry *e = static_cast<ScopeEntry *>(hash_search_with_hash_value(scopes, key, hash, HASH_FIND, nullptr));
	if (e != nullptr)
		return &shared->data[e->slot];
	LWLockRelease(shared->lock);

	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	e = static_cast<ScopeEntry *>(hash_search_with_hash_value(scopes, key, hash, HASH_FIND, nullptr));
	if (e != nullptr)
		return &shared->data[e->slot];
	if (hash_get_num_entries(scopes) >= shared->max_entries)
		evict();
	int slot = shared->nfree > 0 ? shared->free_slot[--shared->nfree]
	           : shared->next_unused < shared->max_entries ? shared->next_unused++
	                                                       : -1;
	bool found;
	e = slot < 0 ? nullptr
	             : static_cast<ScopeEntry *>(hash_search_with_hash_value(scopes, key, hash, HASH_ENTER_NULL, &found));
	if (e == nullptr)
	{
		if (slot >= 0)
			shared->free_slot[shared->nfree++] = slot;
		LWLockRelease(shared->lock);
		return nullptr;
	}
	e->slot = slot;
	e->activity_seen = 0;
	e->usage = 0;
	data_init(&shared->data[slot]);
	return &shared->data[slot];
}

// This backend's stripe, the same index in the counters and in the histograms.
static int
my_stripe()
{
	return (MyProc != nullptr ? compat::proc_number(MyProc) : MyProcPid) % stripes;
}

static int
bucket_of(int64 us)
{
	if (us <= 1)
		return 0;
	int octave = pg_leftmost_one_pos64(static_cast<uint64>(us));
	// the two bits below the leading one: which quarter of the octave
	int quarter = static_cast<int>((static_cast<uint64>(us) << 2 >> octave) & 3);
	return Min(octave * buckets_per_octave + quarter, num_buckets - 1);
}

// The middle of a bucket, in microseconds.
static double
bucket_middle_us(int b)
{
	int octave = b / buckets_per_octave;
	double low = std::ldexp(1.0 + (b % buckets_per_octave) / 4.0, octave);
	double high = std::ldexp(1.0 + (b % buckets_per_octave + 1) / 4.0, octave);
	return (low + high) / 2;
}

// A claim's answer, or IK001: the scope's claims counter goes up with it, saving the claim its own
// lookup. (idem_stats counts every idem_claim call; per scope, a claim that ends in another error
// is not counted.)
static bool
answers_claim(Counter c)
{
	return c == Counter::inserted || c == Counter::takeovers || c == Counter::replays ||
	       c == Counter::in_progress || c == Counter::mismatches;
}

// The data slot of this database's `scope`, found or created, with the lock held; nullptr (no lock
// held) when statistics are off, the scope has no valid key, or there is no room.
static ScopeData *
entry_of(Datum scope)
{
	if (shared == nullptr || !OidIsValid(MyDatabaseId))
		return nullptr;
	ScopeKey key;
	if (!make_key(scope, &key))
		return nullptr;
	return find_or_create(&key, get_hash_value(scopes, &key));
}

static void
add_count(Stripe *s, Counter c, uint64 n)
{
	pg_atomic_fetch_add_u64(&s->count[static_cast<int>(c)], n);
	if (answers_claim(c))
		pg_atomic_fetch_add_u64(&s->count[static_cast<int>(Counter::claims)], n);
}

static void
lookup_and(Datum scope, Counter c, int64 elapsed_us)
{
	ScopeData *d = entry_of(scope);
	if (d == nullptr)
		return;
	int stripe = my_stripe();
	add_count(&d->stripe[stripe], c, 1);
	if (elapsed_us >= 0)
	{
		uint64 epoch = static_cast<uint64>(GetCurrentTimestamp() / window_us);
		int w = static_cast<int>(epoch & 1);
		uint64 held = pg_atomic_read_u64(&d->window_epoch[w]);
		// The first finish of a new window empties it; a count racing with that may be lost.
		if (held != epoch && pg_atomic_compare_exchange_u64(&d->window_epoch[w], &held, epoch))
			for (HistogramStripe &each : times_of(d)->stripe)
				for (pg_atomic_uint32 &b : each.bucket[w])
					pg_atomic_write_u32(&b, 0);
		pg_atomic_fetch_add_u32(&times_of(d)->stripe[stripe].bucket[w][bucket_of(elapsed_us)], 1);
	}
	LWLockRelease(shared->lock);
}

void
scope_stats_count(Counter c, Datum scope)
{
	lookup_and(scope, c, -1);
}

void
scope_stats_add(Datum scope, const uint64 *counts)
{
	ScopeData *d = entry_of(scope);
	if (d == nullptr)
		return;
	Stripe *s = &d->stripe[my_stripe()];
	for (int c = 0; c < scope_counter_count; c++)
		if (counts[c] != 0)
			add_count(s, static_cast<Counter>(c), counts[c]);
	LWLockRelease(shared->lock);
}

void
scope_stats_finished(Counter c, Datum scope, int64 elapsed_us)
{
	lookup_and(scope, c, elapsed_us);
}

// The windows' histogram summed over stripes; returns the number of samples. Lock held.
static uint64
merged_histogram(ScopeData *d, uint64 counts[num_buckets])
{
	uint64 current = static_cast<uint64>(GetCurrentTimestamp() / window_us);
	uint64 total = 0;
	for (int b = 0; b < num_buckets; b++)
		counts[b] = 0;
	for (int w = 0; w < 2; w++)
	{
		uint64 epoch = pg_atomic_read_u64(&d->window_epoch[w]);
		if (epoch != current && epoch + 1 != current)
			continue;
		for (HistogramStripe &h : times_of(d)->stripe)
			for (int b = 0; b < num_buckets; b++)
			{
				uint64 n = pg_atomic_read_u32(&h.bucket[w][b]);
				counts[b] += n;
				total += n;
			}
	}
	return total;
}

// The q-quantile (0 < q <= 1) of `total` samples, in microseconds.
static double
quantile_us(const uint64 counts[num_buckets], uint64 total, double q)
{
	uint64 rank = static_cast<uint64>(std::ceil(q * static_cast<double>(total)));
	uint64 seen = 0;
	for (int b = 0; b < num_buckets; b++)
	{
		seen += counts[b];
		if (seen >= rank && counts[b] > 0)
			return bucket_middle_us(b);
	}
	return bucket_middle_us(num_buckets - 1);
}

bool
scope_stats_work_times(Datum scope, int64 *p90_us, int64 *p99_us)
{
	if (shared == nullptr || !setting_track || !OidIsValid(MyDatabaseId))
		return false;
	ScopeKey key;
	if (!make_key(scope, &key))
		return false;
	uint64 counts[num_buckets];
	uint64 total = 0;
	LWLockAcquire(shared->lock, LW_SHARED);
	ScopeEntry *e = static_cast<ScopeEntry *>(hash_search(scopes, &key, HASH_FIND, nullptr));
	if (e != nullptr)
		total = merged_histogram(&shared->data[e->slot], counts);
	LWLockRelease(shared->lock);
	if (total < min_samples_for_estimate)
		return false;
	*p90_us = static_cast<int64>(quantile_us(counts, total, 0.90));
	*p99_us = static_cast<int64>(quantile_us(counts, total, 0.99));
	return true;
}

bool
scope_stats_enabled()
{
	return shared != nullptr;
}

void
scope_stats_each(ScopeRowEmit emit, void *arg)
{
	LWLockAcquire(shared->lock, LW_SHARED);
	HASH_SEQ_STATUS seq;
	hash_seq_init(&seq, scopes);
	for (ScopeEntry *e; (e = static_cast<ScopeEntry *>(hash_seq_search(&seq))) != nullptr;)
	{
		if (e->key.dboid != MyDatabaseId)
			continue;
		ScopeData *d = &shared->data[e->slot];
		ScopeRow row;
		row.scope = e->key.scope;
		row.len = static_cast<int>(e->key.len);
		for (int c = 0; c < scope_counter_count; c++)
			row.count[c] = sum_count(d, static_cast<Counter>(c));
		uint64 counts[num_buckets];
		uint64 total = merged_histogram(d, counts);
		row.has_times = total != 0;
		int q = 0;
		for (double quantile : {0.50, 0.90, 0.99})
			row.work_ms[q++] = total == 0 ? 0 : quantile_us(counts, total, quantile) / 1000.0;
		emit(arg, &row);
	}
	LWLockRelease(shared->lock);
}

void
scope_stats_forget_database()
{
	if (shared == nullptr)
		return;
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	HASH_SEQ_STATUS seq;
	hash_seq_init(&seq, scopes);
	// dynahash allows removing the entry just returned by a sequential scan
	for (ScopeEntry *e; (e = static_cast<ScopeEntry *>(hash_seq_search(&seq))) != nullptr;)
		if (e->key.dboid == MyDatabaseId)
			remove_entry(e);
	LWLockRelease(shared->lock);
}

} // namespace idem
