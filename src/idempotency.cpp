// Module entry: the library's magic block and its load-time setup.
#include "access/catalog.hpp"
#include "common/pg.hpp"
#include "common/settings.hpp"

extern "C" {
PG_MODULE_MAGIC;

void _PG_init(void);

void
_PG_init(void)
{
	idem::define_settings();
	idem::catalog_register_invalidation();
}
}
