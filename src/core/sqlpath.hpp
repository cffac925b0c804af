// The key's rules (core/rules.hpp) over SQL (access/policypath.hpp): the way to idem_keys when
// row-level security applies to the caller, since the table access layer cannot evaluate
// policies. core/path.hpp chooses it; `c` is the catalog keytable_open left (the table closed).
#pragma once

#include "core/rules.hpp"
#include "core/wait.hpp"

namespace idem {

void sql_claim(const Catalog *c, const ClaimInput *in, Waiter *waiter, ClaimOutput *out);

// As table_update and table_delete (core/tablepath.hpp), on the row locked FOR NO KEY UPDATE.
Datum sql_update(const Catalog *c, Datum scope, Datum key, RowChange change, void *arg);
bool sql_delete(const Catalog *c, Datum scope, Datum key, RowCheck check, void *arg);

// The row as the policies let this caller see it, or false (also for an expired key).
bool sql_lookup(const Catalog *c, Datum scope, Datum key, Datum *row);

// Deletes up to max_rows expired keys that the policies let this caller delete.
int64 sql_reap(const Catalog *c, int32 max_rows);

} // namespace idem
