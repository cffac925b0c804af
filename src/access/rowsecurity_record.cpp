#include "access/rowsecurity_record.hpp"

#include "access/catalog.hpp"
#include "common/errors.hpp"

extern "C" {
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "parser/parser.h"
#include "tcop/pquery.h"
}

namespace idem {

// Set while this backend writes or applies the record: the statements that does fire the
// extension's event triggers and the record tables' triggers, which must not act on them. A
// variable of this file, not a setting: no SQL and no code run inside DDL can set it.
static bool busy = false;

// The objects a policy names (other than idem_keys and pinned built-ins), each with its owner,
// sorted: {"function app.tenant_allowed(text) owned by app_admin", ...}. Recorded with the policy
// and compared again after a restore re-creates it: a name that now resolves to another object, or
// to one of another owner, is refused instead of bound. `p` is the pg_policy row.
static const char *const named_objects =
    "pg_catalog.array_to_string(ARRAY("
    "SELECT DISTINCT o.type OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) o.identity"
    " OPERATOR(pg_catalog.||) ' owned by ' OPERATOR(pg_catalog.||) COALESCE("
    "  pg_catalog.pg_get_userbyid(CASE d.refclassid"
    "   WHEN 'pg_catalog.pg_proc'::pg_catalog.regclass THEN"
    "    (SELECT f.proowner FROM pg_catalog.pg_proc f WHERE f.oid OPERATOR(pg_catalog.=) d.refobjid)"
    "   WHEN 'pg_catalog.pg_class'::pg_catalog.regclass THEN"
    "    (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) d.refobjid)"
    "   WHEN 'pg_catalog.pg_type'::pg_catalog.regclass THEN"
    "    (SELECT t.typowner FROM pg_catalog.pg_type t WHERE t.oid OPERATOR(pg_catalog.=) d.refobjid)"
    "   WHEN 'pg_catalog.pg_operator'::pg_catalog.regclass THEN"
    "    (SELECT x.oprowner FROM pg_catalog.pg_operator x WHERE x.oid OPERATOR(pg_catalog.=) d.refobjid)"
    "   WHEN 'pg_catalog.pg_collation'::pg_catalog.regclass THEN"
    "    (SELECT l.collowner FROM pg_catalog.pg_collation l WHERE l.oid OPERATOR(pg_catalog.=) d.refobjid)"
    "  END)::text, '-')"
    " FROM pg_catalog.pg_depend d, LATERAL pg_catalog.pg_identify_object(d.refclassid, d.refobjid, 0) o"
    " WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_policy'::pg_catalog.regclass"
    "   AND d.objid OPERATOR(pg_catalog.=) p.oid"
    "   AND NOT (d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass"
    "            AND d.refobjid OPERATOR(pg_catalog.=) p.polrelid)"
    " ORDER BY 1), E'\\n')";

struct Record
{
	Oid keys;
	Oid owner; // of idem_keys
	const char *keys_name;      // schema-qualified, quoted
	const char *flags_table;    // idem_row_security
	const char *policies_table; // idem_policies
};

static Record
record_of()
{
	const Catalog *catalog = catalog_get();
	Record r;
	r.keys = catalog->relid;
	const char *schema = get_namespace_name(catalog->namespace_oid);
	HeapTuple tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(r.keys));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "idempotency: cache lookup failed for relation %u", r.keys);
	r.owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);
	r.keys_name = quote_qualified_identifier(schema, "idem_keys");
	r.flags_table = quote_qualified_identifier(schema, "idem_row_security");
	r.policies_table = quote_qualified_identifier(schema, "idem_policies");
	return r;
}

static void
require_owner(const Record &r, const char *what)
{
	if (!has_privs_of_role(GetUserId(), r.owner))
		ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
		                errmsg("only the owner of idem_keys can %s", what),
		                errhint("Run it as the owner of idem_keys or a superuser.")));
}

// Runs fn with `busy` set, connected to SPI with search_path = pg_catalog, pg_temp: expressions
// print with every other name schema-qualified, and no object of the caller's search_path can
// stand in for one this SQL names. An error unwinds the GUC level and SPI with the (sub)transaction.
template <typename Fn>
static void
while_busy(Fn fn)
{
	busy = true;
	PG_TRY();
	{
		int guc_level = NewGUCNestLevel();
		(void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
		                         GUC_ACTION_SAVE, true, 0, false);
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "idempotency: SPI_connect failed");
		fn();
		SPI_finish();
		AtEOXact_GUC(true, guc_level);
	}
	PG_FINALLY();
	{
		busy = false;
	}
	PG_END_TRY();
}

// Runs sql with $1 = idem_keys' OID and $2 = `arg` (text, optional); returns SPI's code.
static int
run(const char *sql, const Record &r, const char *arg = nullptr, int expected = -1)
{
	Oid types[2] = {OIDOID, TEXTOID};
	Datum values[2] = {ObjectIdGetDatum(r.keys), arg ? CStringGetTextDatum(arg) : (Datum) 0};
	int rc = SPI_execute_with_args(sql, arg ? 2 : 1, types, values, nullptr, false, 0);
	if (rc < 0 || (expected >= 0 && rc != expected))
		elog(ERROR, "idempotency: SPI_execute_with_args returned %d", rc);
	return rc;
}

static void
run_utility(const char *sql)
{
	int rc = SPI_execute(sql, false, 0);
	if (rc != SPI_OK_UTILITY)
		elog(ERROR, "idempotency: SPI_execute returned %d", rc);
}

static void
write_flags(const Record &r)
{
	run(psprintf("DELETE FROM %s", r.flags_table), r, nullptr, SPI_OK_DELETE);
	run(psprintf("INSERT INTO %s (enabled, forced)"
	             " SELECT c.relrowsecurity, c.relforcerowsecurity FROM pg_catalog.pg_class c"
	             "  WHERE c.oid OPERATOR(pg_catalog.=) $1 AND (c.relrowsecurity OR c.relforcerowsecurity)",
	             r.flags_table),
	    r, nullptr, SPI_OK_INSERT);
}

static void
write_policies(const Record &r)
{
	run(psprintf("DELETE FROM %s", r.policies_table), r, nullptr, SPI_OK_DELETE);
	run(psprintf("INSERT INTO %s (name, permissive, command, roles, using_expr, check_expr, named)"
	             " SELECT p.polname, p.polpermissive,"
	             "  CASE p.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE'"
	             "   WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,"
	             "  ARRAY(SELECT CASE r WHEN 0 THEN 'public' ELSE pg_catalog.pg_get_userbyid(r)::text END"
	             "   FROM pg_catalog.unnest(p.polroles) AS r ORDER BY 1),"
	             "  pg_catalog.pg_get_expr(p.polqual, p.polrelid),"
	             "  pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid), %s"
	             " FROM pg_catalog.pg_policy p WHERE p.polrelid OPERATOR(pg_catalog.=) $1",
	             r.policies_table, named_objects),
	    r, nullptr, SPI_OK_INSERT);
}

// The record tables belong to idem_keys' owner, so that its owner, and no one else, keeps them.
static void
give_record_to_owner(const Record &r)
{
	const char *owner = quote_identifier(GetUserNameFromId(r.owner, false));
	run_utility(psprintf("ALTER TABLE %s OWNER TO %s", r.flags_table, owner));
	run_utility(psprintf("ALTER TABLE %s OWNER TO %s", r.policies_table, owner));
}

// Whether the command that fired the event trigger changed idem_keys or one of its policies
// (pg_event_trigger_ddl_commands(): the objects it changed, by OID): the name resolved above could
// mean another table by now, had code run inside the command changed search_path.
static bool
command_touched(const Record &r, bool policy)
{
	const char *sql =
	    policy ? "SELECT 1 FROM pg_catalog.pg_event_trigger_ddl_commands() c"
	             " JOIN pg_catalog.pg_policy p ON p.oid OPERATOR(pg_catalog.=) c.objid"
	             " WHERE c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_policy'::pg_catalog.regclass"
	             "   AND p.polrelid OPERATOR(pg_catalog.=) $1"
	           : "SELECT 1 FROM pg_catalog.pg_event_trigger_ddl_commands() c"
	             " WHERE c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass"
	             "   AND c.objid OPERATOR(pg_catalog.=) $1";
	run(sql, r, nullptr, SPI_OK_SELECT);
	return SPI_processed > 0;
}

static bool
dropped_policy(const Record &r)
{
	run("SELECT 1 FROM pg_catalog.pg_event_trigger_dropped_objects() d, pg_catalog.pg_class c"
	    " JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace"
	    " WHERE c.oid OPERATOR(pg_catalog.=) $1 AND d.object_type OPERATOR(pg_catalog.=) 'policy'"
	    "   AND d.address_names[1] OPERATOR(pg_catalog.=) n.nspname"
	    "   AND d.address_names[2] OPERATOR(pg_catalog.=) c.relname",
	    r, nullptr, SPI_OK_SELECT);
	return SPI_processed > 0;
}

void
rowsecurity_on_ddl(const EventTriggerData *event)
{
	if (busy)
		return;
	// First, from the parse tree alone (no catalog read, no privilege): could the command have
	// changed what is recorded? Every other ALTER TABLE of the database stops here.
	bool flags = false, owner = false, policies = false;
	RangeVar *relation = nullptr;
	Node *tree = event->parsetree;
	if (strcmp(event->event, "sql_drop") == 0)
		policies = true;
	else if (IsA(tree, AlterTableStmt))
	{
		relation = ((AlterTableStmt *) tree)->relation;
		ListCell *lc;
		foreach (lc, ((AlterTableStmt *) tree)->cmds)
		{
			switch (((AlterTableCmd *) lfirst(lc))->subtype)
			{
			case AT_EnableRowSecurity:
			case AT_DisableRowSecurity:
			case AT_ForceRowSecurity:
			case AT_NoForceRowSecurity:
				flags = true;
				break;
			case AT_ChangeOwner:
				owner = true;
				break;
			default:
				break;
			}
		}
	}
	else if (IsA(tree, CreatePolicyStmt))
	{
		relation = ((CreatePolicyStmt *) tree)->table;
		policies = true;
	}
	else if (IsA(tree, AlterPolicyStmt))
	{
		relation = ((AlterPolicyStmt *) tree)->table;
		policies = true;
	}
	else if (IsA(tree, RenameStmt) && ((RenameStmt *) tree)->renameType == OBJECT_POLICY)
	{
		relation = ((RenameStmt *) tree)->relation;
		policies = true;
	}
	if (!flags && !owner && !policies)
		return;
	// Then the table the command names, as the command resolved it: another table (a role's own
	// table, even a temporary one named idem_keys) ends here, for the price of a name lookup.
	if (relation != nullptr && RangeVarGetRelid(relation, NoLock, true) != catalog_get()->relid)
		return;

	Record r = record_of();
	while_busy([&] {
		bool ours = strcmp(event->event, "sql_drop") == 0 ? dropped_policy(r)
		                                                  : command_touched(r, policies);
		if (!ours)
			return;
		// Only idem_keys' owner can have run it; the writes below need the same role.
		if (owner)
			give_record_to_owner(r);
		if (flags)
			write_flags(r);
		if (policies)
			write_policies(r);
	});
}

struct RecordedPolicy
{
	const char *name;
	const char *create; // CREATE POLICY ...
	const char *named;  // as recorded, or nullptr (a record carried over from 1.5)
};

static int
apply_record(const Record &r)
{
	// The record, read before anything changes.
	run(psprintf("SELECT pg_catalog.format('CREATE POLICY %%I ON %%s AS %%s FOR %%s TO %%s%%s%%s',"
	             "  p.name, $2, CASE WHEN p.permissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END,"
	             "  p.command,"
	             "  (SELECT pg_catalog.string_agg(CASE x WHEN 'public' THEN 'PUBLIC'"
	             "                                 ELSE pg_catalog.quote_ident(x) END, ', ')"
	             "     FROM pg_catalog.unnest(p.roles) AS x),"
	             "  CASE WHEN p.using_expr IS NULL THEN ''"
	             "       ELSE ' USING (' OPERATOR(pg_catalog.||) p.using_expr OPERATOR(pg_catalog.||) ')' END,"
	             "  CASE WHEN p.check_expr IS NULL THEN ''"
	             "       ELSE ' WITH CHECK (' OPERATOR(pg_catalog.||) p.check_expr OPERATOR(pg_catalog.||) ')' END),"
	             " p.name, p.named"
	             " FROM %s p ORDER BY p.name",
	             r.policies_table),
	    r, r.keys_name, SPI_OK_SELECT);
	int n = (int) SPI_processed;
	RecordedPolicy *recorded = (RecordedPolicy *) palloc0(sizeof(RecordedPolicy) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		HeapTuple tuple = SPI_tuptable->vals[i];
		recorded[i].create = SPI_getvalue(tuple, SPI_tuptable->tupdesc, 1);
		recorded[i].name = SPI_getvalue(tuple, SPI_tuptable->tupdesc, 2);
		recorded[i].named = SPI_getvalue(tuple, SPI_tuptable->tupdesc, 3);
	}
	// The recorded expressions are text that only the owner of idem_keys can write, but a
	// superuser's restore runs them: each must make exactly one CREATE POLICY, or an expression
	// like "true); ALTER ROLE ... SUPERUSER; ... (true" would run as that superuser.
	for (int i = 0; i < n; i++)
	{
		List *statements = raw_parser(recorded[i].create, RAW_PARSE_DEFAULT);
		if (list_length(statements) != 1 ||
		    !IsA(linitial_node(RawStmt, statements)->stmt, CreatePolicyStmt))
			ereport(ERROR,
			        (errcode(ERRCODE_IDEM_ROW_SECURITY_NOT_IN_FORCE),
			         errmsg("policy \"%s\" of idem_keys is not re-created: its record is not one policy",
			                recorded[i].name),
			         errdetail("Its USING or WITH CHECK expression ends the CREATE POLICY statement."),
			         errhint("Correct the row of idem_policies (only the owner of idem_keys can write it), "
			                 "then run SELECT idem_row_security_apply().")));
	}
	run(psprintf("SELECT coalesce(bool_or(enabled), false), coalesce(bool_or(forced), false) FROM %s",
	             r.flags_table),
	    r, nullptr, SPI_OK_SELECT);
	bool isnull;
	bool enabled = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	bool forced = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));

	// No policy the record does not have.
	run("SELECT pg_catalog.format('DROP POLICY %I ON %s', p.polname, $2) FROM pg_catalog.pg_policy p"
	    " WHERE p.polrelid OPERATOR(pg_catalog.=) $1",
	    r, r.keys_name, SPI_OK_SELECT);
	int ndrop = (int) SPI_processed;
	char **drops = (char **) palloc0(sizeof(char *) * Max(ndrop, 1));
	for (int i = 0; i < ndrop; i++)
		drops[i] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
	for (int i = 0; i < ndrop; i++)
		run_utility(drops[i]);

	for (int i = 0; i < n; i++)
	{
		run_utility(recorded[i].create);
		if (recorded[i].named == nullptr)
			continue;
		run(psprintf("SELECT %s FROM pg_catalog.pg_policy p"
		             " WHERE p.polrelid OPERATOR(pg_catalog.=) $1 AND p.polname OPERATOR(pg_catalog.=) $2",
		             named_objects),
		    r, recorded[i].name, SPI_OK_SELECT);
		const char *now = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		if (strcmp(now, recorded[i].named) != 0)
			ereport(ERROR,
			        (errcode(ERRCODE_IDEM_ROW_SECURITY_NOT_IN_FORCE),
			         errmsg("policy \"%s\" of idem_keys names objects other than those recorded",
			                recorded[i].name),
			         errdetail("Recorded: %s. Now: %s.", *recorded[i].named ? recorded[i].named : "none",
			                   *now ? now : "none"),
			         errhint("An object the policy names was renamed, dropped or replaced since it was "
			                 "recorded. Check the objects, then correct the row of idem_policies.")));
	}
	run_utility(psprintf("ALTER TABLE %s %s ROW LEVEL SECURITY", r.keys_name, enabled ? "ENABLE" : "DISABLE"));
	run_utility(psprintf("ALTER TABLE %s %s ROW LEVEL SECURITY", r.keys_name, forced ? "FORCE" : "NO FORCE"));
	// Recorded again as PostgreSQL prints them now, with the objects they name (a record carried
	// over from 1.5 has none).
	write_policies(r);
	return n;
}

int
rowsecurity_apply()
{
	Record r = record_of();
	require_owner(r, "apply the record of its row-level security");
	int n = 0;
	while_busy([&] { n = apply_record(r); });
	return n;
}

void
rowsecurity_apply_loaded()
{
	if (busy)
		return;
	Record r = record_of();
	require_owner(r, "change the record of its row-level security");
	MemoryContext caller = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	BeginInternalSubTransaction(nullptr);
	MemoryContextSwitchTo(caller);
	PG_TRY();
	{
		(void) rowsecurity_apply();
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(caller);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(caller);
		ErrorData *error = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(caller);
		CurrentResourceOwner = owner;
		ereport(WARNING,
		        (errcode(error->sqlerrcode),
		         errmsg("row-level security of idem_keys was not restored: %s", error->message),
		         error->detail ? errdetail_internal("%s", error->detail) : 0,
		         errhint("Fix the cause, then run SELECT idem_row_security_apply() as the owner of "
		                 "idem_keys. Until then the roles it would confine are refused (IK006).")));
		FreeErrorData(error);
	}
	PG_END_TRY();
}

void
rowsecurity_check_keys_load(Relation keys)
{
	// A restore's COPY: pg_restore and the scripts of pg_dump run with row_security off. A COPY
	// with it on (a resharding tool moving keys, say) is the role's own business, as an INSERT is.
	if (row_security || ActivePortal == nullptr || ActivePortal->commandTag != CMDTAG_COPY ||
	    keys->rd_rel->relrowsecurity || has_privs_of_role(GetUserId(), keys->rd_rel->relowner))
		return;
	ereport(ERROR,
	        (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
	         errmsg("only the owner of idem_keys can load keys into it with COPY"),
	         errdetail("A restore by another role cannot restore the row-level security of idem_keys, "
	                   "and would leave every tenant's keys readable."),
	         errhint("Restore as a superuser, or as a role a superuser made the owner of idem_keys "
	                 "(ALTER TABLE idem_keys OWNER TO ...) before the restore.")));
}

} // namespace idem
