#include "access/catalog.hpp"
#include "common/compat.hpp"

namespace idem {

static Catalog cache;
static bool cache_valid = false;
static uint64 cache_generation = 0; // counts the invalidations that reached the cache

// What the cache allocates lives in `cache_memory`. A rebuild keeps the previous generation's
// memory alive until the next one, so a caller still holding a copy of the old catalog is safe.
static MemoryContext cache_memory = nullptr;
static MemoryContext previous_cache_memory = nullptr;

static Oid acl_user = InvalidOid;
static AclMode acl_held = 0;

const char *const column_names[NUM_COLUMNS] = {
	"scope",     "key",        "state",        "attempt",      "fingerprint", "response",
	"response_code", "retryable", "created_at", "locked_until", "completed_at", "expires_at",
	"response_body", "response_headers", "claimed_at"};

const char *const state_labels[NUM_STATES] = {"pending", "succeeded", "failed"};

static Oid
extension_namespace()
{
	Relation rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyData key;
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
	            CStringGetDatum("idempotency"));
	SysScanDesc scan = systable_beginscan(rel, ExtensionNameIndexId, true, nullptr, 1, &key);
	HeapTuple tuple = systable_getnext(scan);
	Oid nsp = HeapTupleIsValid(tuple) ? ((Form_pg_extension) GETSTRUCT(tuple))->extnamespace
	                                  : InvalidOid;
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	if (!OidIsValid(nsp))
		ereport(ERROR, (errcode(ERRCODE_UNDEFINED_OBJECT),
		                errmsg("extension \"idempotency\" is not installed in this database"),
		                errhint("Run CREATE EXTENSION idempotency.")));
	return nsp;
}

static Oid
relation_in(const char *name, Oid nsp)
{
	Oid relid = get_relname_relid(name, nsp);
	if (!OidIsValid(relid))
		ereport(ERROR, (errcode(ERRCODE_UNDEFINED_OBJECT),
		                errmsg("relation \"%s\" of extension \"idempotency\" does not exist", name),
		                errhint("Reinstall the extension: DROP EXTENSION idempotency; CREATE EXTENSION idempotency.")));
	return relid;
}

static Oid
enum_label(Oid enum_type, const char *label)
{
	HeapTuple tuple =
	    SearchSysCache2(ENUMTYPOIDNAME, ObjectIdGetDatum(enum_type), CStringGetDatum(label));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "idempotency: label \"%s\" of type %u not found", label, enum_type);
	Oid oid = ((Form_pg_enum) GETSTRUCT(tuple))->oid;
	ReleaseSysCache(tuple);
	return oid;
}

static void
build(Catalog *c)
{
	Oid nsp = extension_namespace();
	c->namespace_oid = nsp;
	c->relid = relation_in("idem_keys", nsp);
	c->pkey_oid = relation_in("idem_keys_pkey", nsp);
	c->expiry_oid = relation_in("idem_keys_expires_at_idx", nsp);

	c->version_1_2 = true;
	for (int i = 0; i < NUM_COLUMNS; i++)
	{
		c->attnum[i] = get_attnum(c->relid, column_names[i]);
		if (c->attnum[i] == InvalidAttrNumber)
		{
			if (i < FIRST_1_2_COLUMN)
				elog(ERROR, "idempotency: column \"%s\" of idem_keys does not exist", column_names[i]);
			c->version_1_2 = false;
			c->type[i] = InvalidOid;
			c->typlen[i] = -1;
			c->typbyval[i] = false;
			continue;
		}
		c->type[i] = get_atttype(c->relid, c->attnum[i]);
		get_typlenbyval(c->type[i], &c->typlen[i], &c->typbyval[i]);
	}
	// Partly updated is not a state ALTER EXTENSION leaves (one transaction); refuse to guess.
	if (!c->version_1_2)
		for (int i = FIRST_1_2_COLUMN; i < NUM_COLUMNS; i++)
			if (c->attnum[i] != InvalidAttrNumber)
				elog(ERROR, "idempotency: idem_keys has some of the 1.2 columns but not all");
	for (int i = 0; i < NUM_STATES; i++)
		c->state_label[i] = enum_label(c->type[COL_STATE], state_labels[i]);

	if (previous_cache_memory != nullptr)
		MemoryContextDelete(previous_cache_memory);
	previous_cache_memory = cache_memory;
	cache_memory = AllocSetContextCreate(CacheMemoryContext, "idempotency catalog", ALLOCSET_SMALL_SIZES);
	c->indexes_loaded = false;
	acl_user = InvalidOid;

	// The scan keys' FmgrInfos must outlive this call.
	MemoryContext old = MemoryContextSwitchTo(cache_memory);
	const Column pkey_columns[2] = {COL_SCOPE, COL_KEY};
	for (int i = 0; i < 2; i++)
	{
		Oid type, collation;
		int32 typmod;
		get_atttypetypmodcoll(c->relid, c->attnum[pkey_columns[i]], &type, &typmod, &collation);
		ScanKeyEntryInitialize(&c->pkey_scankey[i], 0, i + 1, BTEqualStrategyNumber, InvalidOid,
		                       collation, F_TEXTEQ, (Datum) 0);
	}
	// The right-hand type is named: BRIN's minmax looks its operator up by it (btree would default).
	ScanKeyEntryInitialize(&c->expiry_scankey, 0, 1, BTLessEqualStrategyNumber, TIMESTAMPTZOID,
	                       InvalidOid, F_TIMESTAMPTZ_LE, (Datum) 0);
	MemoryContextSwitchTo(old);
}

const Catalog *
catalog_get()
{
	if (!cache_valid)
	{
		build(&cache);
		cache.generation = cache_generation;
		cache_valid = true;
	}
	return &cache;
}

bool
catalog_is_current(const Catalog *catalog)
{
	return cache_valid && catalog->generation == cache_generation;
}

void
catalog_load_indexes(Relation rel)
{
	if (cache.indexes_loaded || RelationGetRelid(rel) != cache.relid)
		return;
	MemoryContext old = MemoryContextSwitchTo(cache_memory);
	List *oids = RelationGetIndexList(rel);
	cache.nindexes = list_length(oids);
	cache.index_oid = (Oid *) palloc(sizeof(Oid) * cache.nindexes);
	cache.index_info = (IndexInfo **) palloc0(sizeof(IndexInfo *) * cache.nindexes);
	int i = 0;
	ListCell *lc;
	foreach (lc, oids)
	{
		Oid oid = lfirst_oid(lc);
		cache.index_oid[i] = oid;
		Relation index = index_open(oid, AccessShareLock);
		IndexInfo *info = BuildIndexInfo(index);
		if (info->ii_Expressions == NIL && info->ii_Predicate == NIL)
			cache.index_info[i] = info;
		index_close(index, AccessShareLock);
		i++;
	}
	MemoryContextSwitchTo(old);
	cache.indexes_loaded = true;
}

AclMode
catalog_privileges(Oid user)
{
	if (user != acl_user)
	{
		acl_held = pg_class_aclmask(cache.relid, user, ACL_SELECT | ACL_INSERT | ACL_UPDATE | ACL_DELETE,
		                            ACLMASK_ALL);
		acl_user = user;
	}
	return acl_held;
}

static void
forget_privileges(Datum, compat::SyscacheId, uint32)
{
	acl_user = InvalidOid;
}

static void
forget(Datum, Oid relid)
{
	if (!cache_valid)
		return;
	if (relid == InvalidOid || relid == cache.relid || relid == cache.pkey_oid ||
	    relid == cache.expiry_oid)
	{
		cache_valid = false;
		acl_user = InvalidOid;
		cache_generation++;
	}
}

void
catalog_register_invalidation()
{
	CacheRegisterRelcacheCallback(forget, (Datum) 0);
	// Role attributes (superuser, bypassrls) and memberships decide privileges too.
	CacheRegisterSyscacheCallback(AUTHOID, forget_privileges, (Datum) 0);
	CacheRegisterSyscacheCallback(AUTHMEMMEMROLE, forget_privileges, (Datum) 0);
}

} // namespace idem
