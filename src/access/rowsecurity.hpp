// Row-level security of idem_keys as the extension records it (idem_row_security and
// idem_policies, docs/security.md). A restore puts it back by itself; when it could not (a policy
// naming a role the new cluster lacks or an object that is no longer the one recorded, a
// data-only restore with triggers disabled), the roles it would confine are refused rather than
// shown every tenant's keys.
#pragma once

#include "common/pg.hpp"

namespace idem {

// Raises IK006 when the recorded row-level security is enabled, `rel` (idem_keys, open) lacks it
// or one of the recorded policies, and row-level security would apply to the current user.
void rowsecurity_require_in_force(Relation rel, Oid namespace_oid);

// True when the current user is one the recorded row-level security would confine while `rel`
// lacks it (the check above, without raising).
bool rowsecurity_missing_for_user(Relation rel, Oid namespace_oid);

// The same two for idem_keys, opened here (callers that do not have it open).
void rowsecurity_require_in_force_for_keys();
bool rowsecurity_missing_for_keys();

} // namespace idem
