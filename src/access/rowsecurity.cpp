#include "access/rowsecurity.hpp"

#include "access/catalog.hpp"
#include "common/errors.hpp"

extern "C" {
#include "rewrite/rowsecurity.h"
}

namespace idem {

// The record is read at every check, never cached: a restore that loads it with triggers disabled
// changes two ordinary tables and sends no invalidation, and every session, including those opened
// before it, must see it at once. Roles row-level security never applies to (superusers, BYPASSRLS)
// read nothing; for the others it is a scan of a one-row table, and of idem_policies only while the
// flags are recorded (cost: docs/benchmarks.md).

struct RecordedFlags
{
	bool enabled;
	bool forced;
};

// Reads a configuration table with the catalog snapshot (the latest committed rows, whatever the
// caller's privileges on it); absent before ALTER EXTENSION UPDATE to 1.5. `row` returns false to
// stop the scan.
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
	{
		if (!row(tuple, RelationGetDescr(rel)))
			break;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
}

static RecordedFlags
read_flags(Oid namespace_oid)
{
	RecordedFlags flags = {false, false};
	read_table(namespace_oid, "idem_row_security", [&](HeapTuple tuple, TupleDesc desc) {
		bool isnull;
		Datum enabled = heap_getattr(tuple, 2, desc, &isnull);
		flags.enabled = !isnull && DatumGetBool(enabled);
		Datum forced = heap_getattr(tuple, 3, desc, &isnull);
		flags.forced = !isnull && DatumGetBool(forced);
		return false;
	});
	return flags;
}

static const RowSecurityPolicy *
live_policy(Relation keys, const char *name)
{
	if (keys->rd_rsdesc == nullptr)
		return nullptr;
	ListCell *lc;
	foreach (lc, keys->rd_rsdesc->policies)
	{
		const RowSecurityPolicy *policy = (const RowSecurityPolicy *) lfirst(lc);
		if (strcmp(policy->policy_name, name) == 0)
			return policy;
	}
	return nullptr;
}

// Whether the recorded role names (text[]; "public" for every role) are the policy's roles now. A
// role renamed, or taken out of the policy by DROP OWNED, since the record was written makes them
// differ: the record would restore another policy than the one in force.
static bool
same_roles(const RowSecurityPolicy *policy, Datum recorded)
{
	Datum *names;
	bool *nulls;
	int nnames;
	deconstruct_array(DatumGetArrayTypeP(recorded), TEXTOID, -1, false, TYPALIGN_INT, &names, &nulls,
	                  &nnames);
	int nlive = ARR_DIMS(policy->roles)[0];
	const Oid *live = (const Oid *) ARR_DATA_PTR(policy->roles);
	if (nnames != nlive)
		return false;
	for (int i = 0; i < nnames; i++)
	{
		if (nulls[i])
			return false;
		char *name = TextDatumGetCString(names[i]);
		bool is_public = strcmp(name, "public") == 0;
		Oid role = is_public ? ACL_ID_PUBLIC : get_role_oid(name, true);
		if (!is_public && !OidIsValid(role))
			return false;
		bool found = false;
		for (int j = 0; j < nlive && !found; j++)
			found = live[j] == role;
		if (!found)
			return false;
	}
	return true;
}

// What the recorded row-level security has that `keys` lacks, as a DETAIL sentence (palloc'd), or
// nullptr.
static char *
missing_part(Relation keys, Oid namespace_oid, RecordedFlags flags)
{
	if (!keys->rd_rel->relrowsecurity)
		return pstrdup("It is recorded as enabled, but row-level security is disabled.");
	if (flags.forced && !keys->rd_rel->relforcerowsecurity)
		return pstrdup("It is recorded as enabled, but row-level security is not forced.");
	char *missing = nullptr;
	read_table(namespace_oid, "idem_policies", [&](HeapTuple tuple, TupleDesc desc) {
		bool isnull, roles_null;
		Datum name = heap_getattr(tuple, 1, desc, &isnull);
		Datum roles = heap_getattr(tuple, 4, desc, &roles_null);
		if (isnull)
			return true;
		char *recorded = TextDatumGetCString(name);
		const RowSecurityPolicy *policy = live_policy(keys, recorded);
		if (policy == nullptr)
			missing = psprintf("The recorded policy \"%s\" is missing.", recorded);
		else if (roles_null || !same_roles(policy, roles))
			missing = psprintf("The roles of policy \"%s\" are not those recorded (a role was renamed, "
			                   "or dropped from the policy, since).", recorded);
		return missing == nullptr;
	});
	return missing;
}

// Roles row-level security never applies to: superusers and BYPASSRLS roles.
static bool
exempt_user(Oid user)
{
	return superuser_arg(user) || has_bypassrls_privilege(user);
}

// What the current user is refused for (a DETAIL sentence), or nullptr: row-level security would
// apply to it (not exempt, and not the table's owner unless it is forced) and the table lacks what
// is recorded.
static char *
missing_for_user(Relation rel, Oid namespace_oid)
{
	Oid user = GetUserId();
	if (exempt_user(user))
		return nullptr;
	RecordedFlags flags = read_flags(namespace_oid);
	if (!flags.enabled)
		return nullptr;
	if (!flags.forced && has_privs_of_role(user, rel->rd_rel->relowner))
		return nullptr;
	return missing_part(rel, namespace_oid, flags);
}

bool
rowsecurity_missing_for_user(Relation rel, Oid namespace_oid)
{
	return missing_for_user(rel, namespace_oid) != nullptr;
}

void
rowsecurity_require_in_force(Relation rel, Oid namespace_oid)
{
	const char *missing = missing_for_user(rel, namespace_oid);
	if (missing == nullptr)
		return;
	ereport(ERROR,
	        (errhidestmt(true), errcode(ERRCODE_IDEM_ROW_SECURITY_NOT_IN_FORCE),
	         errmsg("row-level security of idem_keys is not in force"), errdetail_internal("%s", missing),
	         errhint("The owner of idem_keys runs SELECT idem_row_security_apply(), or records the "
	                 "policy in force again with ALTER POLICY.")));
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
