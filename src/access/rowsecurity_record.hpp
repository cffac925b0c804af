// Keeping the record of idem_keys' row-level security (idem_row_security and idem_policies,
// docs/security.md): written when DDL changes the table's flags or policies, applied when a restore
// loads it. Everything here runs as the calling role: only the owner of idem_keys (or a superuser)
// can write the record or apply it, and DDL that does not touch idem_keys reads nothing of it.
#pragma once

#include "common/pg.hpp"

extern "C" {
#include "commands/event_trigger.h"
}

namespace idem {

// The event trigger: after DDL that changed idem_keys' row-level security flags, its policies or
// its owner, writes what the table has now into the record (and gives the record tables to the
// table's new owner).
void rowsecurity_on_ddl(const EventTriggerData *event);

// Makes idem_keys what the record says (flags, every recorded policy, no other) and returns the
// number of policies. A policy whose objects are not the ones recorded (another owner, another
// object under the recorded name) raises IK006 and changes nothing. Owner of idem_keys only.
int rowsecurity_apply();

// The record tables' statement trigger: a write of the record (a restore loading it) by the
// owner is applied; a failure becomes a WARNING, so that the restore goes on and the confined
// roles are refused (IK006) until it is fixed. A write by any other role is refused.
void rowsecurity_apply_loaded();

// idem_keys' statement trigger: keys loaded with COPY and row_security off (a restore) into a
// table without row-level security, by a role that does not own it, are refused. Such a role cannot write the record, so
// the restore would leave every tenant's keys open; refused, the keys are not there to be read.
void rowsecurity_check_keys_load(Relation keys);

} // namespace idem
