// The SQL-callable side of the recorded row-level security (docs/security.md): the check for the
// extension's views over idem_keys (the functions check it when they open the table), the event
// trigger that records DDL, the trigger that applies a loaded record, the manual apply, and the
// check of keys loaded by a restore.
#include "access/rowsecurity.hpp"
#include "access/rowsecurity_record.hpp"
#include "common/guard.hpp"

extern "C" {
#include "commands/trigger.h"
}

using namespace idem;

// idem_row_security_check(): true, or IK006 for a role the recorded row-level security would
// confine while idem_keys lacks it.
IDEM_SQL_FUNCTION(idem_row_security_check)
{
	rowsecurity_require_in_force_for_keys();
	PG_RETURN_BOOL(true);
}

// idem_row_security_ddl(): the event trigger on ALTER TABLE, CREATE / ALTER / DROP POLICY.
IDEM_SQL_FUNCTION(idem_row_security_ddl)
{
	if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
		ereport(ERROR, (errcode(ERRCODE_E_R_I_E_EVENT_TRIGGER_PROTOCOL_VIOLATED),
		                errmsg("idem_row_security_ddl() is called by event triggers only")));
	rowsecurity_on_ddl((EventTriggerData *) fcinfo->context);
	PG_RETURN_VOID();
}

// idem_row_security_restore(): the statement trigger of idem_row_security and idem_policies.
IDEM_SQL_FUNCTION(idem_row_security_restore)
{
	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
		                errmsg("idem_row_security_restore() is called by triggers only")));
	rowsecurity_apply_loaded();
	return (Datum) 0;  // a statement trigger returns a NULL pointer
}

// idem_row_security_apply(): the number of policies re-created.
IDEM_SQL_FUNCTION(idem_row_security_apply)
{
	PG_RETURN_INT32(rowsecurity_apply());
}

// idem_keys_load_check(): the statement trigger of idem_keys before INSERT (COPY fires it).
IDEM_SQL_FUNCTION(idem_keys_load_check)
{
	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
		                errmsg("idem_keys_load_check() is called by triggers only")));
	rowsecurity_check_keys_load(((TriggerData *) fcinfo->context)->tg_relation);
	return (Datum) 0;  // a statement trigger returns a NULL pointer
}
