#include "access/rowsecurity.hpp"

#include "access/catalog.hpp"
#include "common/errors.hpp"

extern "C" {
#include "rewrite/rowsecurity.h"
}

namespace idem {

// What the configuration tables record, read once per backend and again after a relcache
// invalidation of idem_keys (every change of its row-level security or policies sends one; so
// does idem_row_security_apply()).
static bool recorded_valid = false;
static Oid recorded_relid = InvalidOid;
static bool recorded_enabled = false;
static bool recorded_forced = false;
static List *recorded_policies = NIL; // char *, in TopMemoryContext

static void
forget(Datum, Oid relid)
{
	if (relid == InvalidOid || relid == recorded_relid)
		recorded_valid = false;
}

void
rowsecurity_register_invalidation()
{
	CacheRegisterRelcacheCallback(forget, (Datum) 0);
}

// Reads a configuration table with the catalog snapshot (the latest committed rows, whatever the
// caller's privileges on it); absent before ALTER EXTENSION UPDATE to 1.5.
template <typename Row>
static void
read_table(Oid namespace_oid, const char *name, Row row)
{
	Oid relid = get_relname_relid(name, namespace_oid);
	if (!OidIsValid(relid))
		return;
	Relation rel = table_open(relid, AccessShareLock);
	SysScanDesc scan = systable_beginscan(rel, InvalidOid, false, nullptr, 0, nullptr);
	HeapTuple tuple;
	while ((tuple = systable_getnext(scan)) != nullptr)
		row(tuple, RelationGetDescr(rel));
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
}

static void
load_recorded(Relation keys, Oid namespace_oid)
{
	list_free_deep(recorded_policies);
	recorded_policies = NIL;
	recorded_enabled = recorded_forced = false;
	read_table(namespace_oid, "idem_row_security", [](HeapTuple tuple, TupleDesc desc) {
		bool isnull;
		Datum enabled = heap_getattr(tuple, 2, desc, &isnull);
		recorded_enabled = !isnull && DatumGetBool(enabled);
		Datum forced = heap_getattr(tuple, 3, desc, &isnull);
		recorded_forced = !isnull && DatumGetBool(forced);
	});
	read_table(namespace_oid, "idem_policies", [](HeapTuple tuple, TupleDesc desc) {
		bool isnull;
		Datum name = heap_getattr(tuple, 1, desc, &isnull);
		if (isnull)
			return;
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
		recorded_policies = lappend(recorded_policies, TextDatumGetCString(name));
		MemoryContextSwitchTo(old);
	});
	recorded_relid = RelationGetRelid(keys);
	recorded_valid = true;
}

static bool
has_policy(Relation keys, const char *name)
{
	if (keys->rd_rsdesc == nullptr)
		return false;
	ListCell *lc;
	foreach (lc, keys->rd_rsdesc->policies)
	{
		const RowSecurityPolicy *policy = (const RowSecurityPolicy *) lfirst(lc);
		if (strcmp(policy->policy_name, name) == 0)
			return true;
	}
	return false;
}

// The first thing the recorded row-level security has that `keys` lacks, or nullptr.
static const char *
missing_part(Relation keys)
{
	if (!keys->rd_rel->relrowsecurity)
		return "row-level security is disabled";
	if (recorded_forced && !keys->rd_rel->relforcerowsecurity)
		return "row-level security is not forced";
	ListCell *lc;
	foreach (lc, recorded_policies)
	{
		if (!has_policy(keys, (const char *) lfirst(lc)))
			return (const char *) lfirst(lc);
	}
	return nullptr;
}

// Row-level security would apply to the current user: not a superuser, not BYPASSRLS, and not
// the table's owner unless it is forced.
static bool
confined_user(Relation keys)
{
	Oid user = GetUserId();
	if (superuser_arg(user) || has_bypassrls_privilege(user))
		return false;
	return recorded_forced || !has_privs_of_role(user, keys->rd_rel->relowner);
}

bool
rowsecurity_missing_for_user(Relation rel, Oid namespace_oid)
{
	if (!recorded_valid || recorded_relid != RelationGetRelid(rel))
		load_recorded(rel, namespace_oid);
	return recorded_enabled && missing_part(rel) != nullptr && confined_user(rel);
}

void
rowsecurity_require_in_force(Relation rel, Oid namespace_oid)
{
	if (!rowsecurity_missing_for_user(rel, namespace_oid))
		return;
	const char *missing = missing_part(rel);
	bool is_policy = rel->rd_rel->relrowsecurity &&
	                 !(recorded_forced && !rel->rd_rel->relforcerowsecurity);
	ereport(ERROR,
	        (errhidestmt(true), errcode(ERRCODE_IDEM_ROW_SECURITY_NOT_IN_FORCE),
	         errmsg("row-level security of idem_keys is not in force"),
	         is_policy ? errdetail("The recorded policy \"%s\" is missing.", missing)
	                   : errdetail("It is recorded as enabled, but %s.", missing),
	         errhint("The owner of idem_keys runs SELECT idem_row_security_apply().")));
}

template <typename Check>
static auto
with_keys(Check check) -> decltype(check(nullptr, InvalidOid))
{
	const Catalog *catalog = catalog_get();
	Oid relid = catalog->relid;
	Oid namespace_oid = catalog->namespace_oid;
	Relation rel = table_open(relid, AccessShareLock);
	auto result = check(rel, namespace_oid);
	table_close(rel, AccessShareLock);
	return result;
}

void
rowsecurity_require_in_force_for_keys()
{
	with_keys([](Relation rel, Oid namespace_oid) {
		rowsecurity_require_in_force(rel, namespace_oid);
		return true;
	});
}

bool
rowsecurity_missing_for_keys()
{
	return with_keys(rowsecurity_missing_for_user);
}

} // namespace idem
