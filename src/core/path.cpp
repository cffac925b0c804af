#include "core/path.hpp"

#include "access/writememo.hpp"
#include "core/sqlpath.hpp"

namespace idem {

const Catalog *
path_open(KeyPath *p, Access access, const char *caller)
{
	p->direct = keytable_open(&p->kt, access, caller);
	p->batch_claims = false;
	p->remember = false;
	return &p->kt.catalog;
}

void
path_close(KeyPath *p)
{
	if (!p->direct)
		return;
	keytable_close(&p->kt);
	if (p->batch_claims)
		table_batch_guess_end(&p->guess);
}

void
path_claim(KeyPath *p, const ClaimInput *in, Waiter *waiter, ClaimOutput *out)
{
	if (p->direct)
		table_claim(&p->kt, in, waiter, out);
	else
		sql_claim(&p->kt.catalog, in, waiter, out);
}

void
path_batch_begin(KeyPath *p)
{
	if (p->direct)
		keytable_prepare_write(&p->kt);
}

void
path_batch_claims_begin(KeyPath *p, Datum scope, int nkeys, bool remember)
{
	p->batch_claims = true;
	p->remember = remember;
	if (!p->direct)
		return;
	if (remember)
		keytable_batch_begin(&p->kt, scope, nkeys);
	table_batch_guess_begin(&p->guess);
}

void
path_batch_claim(KeyPath *p, const ClaimInput *in, Waiter *waiter, ClaimOutput *out)
{
	if (!p->direct)
	{
		sql_claim(&p->kt.catalog, in, waiter, out);
		return;
	}
	table_batch_claim(&p->kt, &p->guess, in, waiter, out);
	if (p->remember)
		keytable_batch_note(&p->kt, in->scope, in->key);
}

void
path_batch_next(KeyPath *p)
{
	if (p->direct)
		keytable_clear(&p->kt);
}

Datum
path_update(KeyPath *p, Datum scope, Datum key, RowChange change, void *arg)
{
	if (p->direct)
		return table_update(&p->kt, scope, key, change, arg);
	return sql_update(&p->kt.catalog, scope, key, change, arg);
}

bool
path_delete(KeyPath *p, Datum scope, Datum key, RowCheck check, void *arg)
{
	if (p->direct)
		return table_delete(&p->kt, scope, key, check, arg);
	return sql_delete(&p->kt.catalog, scope, key, check, arg);
}

bool
path_lookup(KeyPath *p, Datum scope, Datum key, Datum *row)
{
	if (p->direct)
		return table_lookup(&p->kt, scope, key, row);
	return sql_lookup(&p->kt.catalog, scope, key, row);
}

int64
path_reap(KeyPath *p, int32 max_rows)
{
	if (p->direct)
		return table_reap(&p->kt, max_rows);
	return sql_reap(&p->kt.catalog, max_rows);
}

} // namespace idem
