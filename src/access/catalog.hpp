// Where the extension's objects are: found once per backend through pg_extension.extnamespace
// (never search_path) and forgotten when a relcache invalidation touches the table or its indexes,
// so DROP/CREATE EXTENSION in one session keeps working.
#pragma once

#include "common/pg.hpp"

namespace idem {

// The public columns of idem_keys (docs/contract.md §1 and §9.7), in their documented order. The
// columns from COL_RESPONSE_BODY on came with 1.2: until ALTER EXTENSION UPDATE adds them, a 1.1
// table lacks them, and they read as NULL and are not written.
enum Column
{
	COL_SCOPE,
	COL_KEY,
	COL_STATE,
	COL_ATTEMPT,
	COL_FINGERPRINT,
	COL_RESPONSE,
	COL_RESPONSE_CODE,
	COL_RETRYABLE,
	COL_CREATED_AT,
	COL_LOCKED_UNTIL,
	COL_COMPLETED_AT,
	COL_EXPIRES_AT,
	COL_RESPONSE_BODY,
	COL_RESPONSE_HEADERS,
	COL_CLAIMED_AT,
	NUM_COLUMNS
};

constexpr int FIRST_1_2_COLUMN = COL_RESPONSE_BODY;

extern const char *const column_names[NUM_COLUMNS];

enum KeyState
{
	STATE_PENDING,
	STATE_SUCCEEDED,
	STATE_FAILED,
	NUM_STATES
};

extern const char *const state_labels[NUM_STATES];

struct Catalog
{
	Oid namespace_oid; // the extension's schema
	Oid relid;
	Oid pkey_oid;    // idem_keys_pkey: (scope, key)
	Oid expiry_oid;  // idem_keys_expires_at_idx: (expires_at)
	AttrNumber attnum[NUM_COLUMNS]; // InvalidAttrNumber: a 1.2 column of a 1.1 table
	bool version_1_2;               // the 1.2 columns exist (ALTER EXTENSION UPDATE has run)
	Oid type[NUM_COLUMNS];
	int16 typlen[NUM_COLUMNS];
	bool typbyval[NUM_COLUMNS];
	Oid state_label[NUM_STATES]; // pg_enum OIDs of idem_state's labels
	// Scan-key templates with their comparison functions resolved once; callers copy them and
	// fill in sk_argument.
	ScanKeyData pkey_scankey[2];
	ScanKeyData expiry_scankey;
	// The table's indexes, read under the table's lock by catalog_load_indexes. index_info is
	// nullptr for an index with expressions or a predicate: its IndexInfo carries per-query state,
	// so it is built per call. The others keep what their access method caches in ii_AmCache
	// (BRIN: its BrinDesc, which points into the index's relcache entry) until the next
	// invalidation: not to be used from a copy that is no longer current (catalog_is_current).
	bool indexes_loaded;
	int nindexes;
	Oid *index_oid;
	IndexInfo **index_info;
	uint64 generation; // which build of the cache this is (catalog_is_current)
};

// The catalog of the extension in this database; ERROR if it is not installed. The pointer stays
// valid until the next invalidation is processed (any table_open may process one): callers copy
// what they need or re-fetch after opening relations (see KeyTable).
const Catalog *catalog_get();

// True while no invalidation has reached the cache since `catalog` (the one catalog_get returned,
// or a copy of it) was built.
bool catalog_is_current(const Catalog *catalog);

// Reads the index list of the open table into the cache, once per catalog.
void catalog_load_indexes(Relation rel);

// The privileges among SELECT, INSERT, UPDATE and DELETE that `user` holds on idem_keys, remembered
// until a grant, an ownership or a role change invalidates them.
AclMode catalog_privileges(Oid user);

void catalog_register_invalidation();

} // namespace idem
