// The SQL-callable check of the recorded row-level security (1.5, docs/security.md), for the
// extension's views over idem_keys: the functions check it when they open the table.
#include "access/rowsecurity.hpp"
#include "common/guard.hpp"

using namespace idem;

// idem_row_security_check(): true, or IK006 for a role the recorded row-level security would
// confine while idem_keys lacks it.
IDEM_SQL_FUNCTION(idem_row_security_check)
{
	rowsecurity_require_in_force_for_keys();
	PG_RETURN_BOOL(true);
}
