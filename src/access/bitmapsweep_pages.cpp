// Until 17 the caller hands the heap one bitmap page at a time: the sweeps skip the pages outside
// them as they come.
#include "access/bitmapsweep.hpp"

#include "common/compat.hpp"

#if PG_VERSION_NUM < 180000

namespace idem {

struct BitmapSweep
{
	TIDBitmap *bitmap;
	TBMIterator *iterator;
	TBMIterateResult *page;
	TableScanDesc heap;
	BlockNumber start;
	bool second_sweep;
};

BitmapSweep *
bitmap_sweep_begin(Relation rel, Snapshot snapshot, TIDBitmap *bitmap, BlockNumber start)
{
	BitmapSweep *sweep = static_cast<BitmapSweep *>(palloc0(sizeof(BitmapSweep)));
	sweep->bitmap = bitmap;
	sweep->heap = compat::begin_bitmap_heap_scan(rel, snapshot);
	sweep->iterator = tbm_begin_iterate(bitmap);
	sweep->start = start;
	return sweep;
}

// The next page of the bitmap in this sweep, read; false when both sweeps are done.
static bool
next_page(BitmapSweep *sweep)
{
	for (;;)
	{
		sweep->page = tbm_iterate(sweep->iterator);
		if (sweep->page == nullptr || (sweep->second_sweep && sweep->page->blockno >= sweep->start))
		{
			if (sweep->second_sweep || sweep->start == 0)
				return false;
			tbm_end_iterate(sweep->iterator);
			sweep->iterator = tbm_begin_iterate(sweep->bitmap);
			sweep->second_sweep = true;
			continue;
		}
		if (!sweep->second_sweep && sweep->page->blockno < sweep->start)
			continue;
		if (table_scan_bitmap_next_block(sweep->heap, sweep->page))
			return true;
	}
}

bool
bitmap_sweep_next(BitmapSweep *sweep, TupleTableSlot *slot)
{
	for (;;)
	{
		if (sweep->page == nullptr && !next_page(sweep))
			return false;
		if (table_scan_bitmap_next_tuple(sweep->heap, sweep->page, slot))
			return true;
		sweep->page = nullptr;
	}
}

void
bitmap_sweep_end(BitmapSweep *sweep)
{
	table_endscan(sweep->heap);
	tbm_end_iterate(sweep->iterator);
	tbm_free(sweep->bitmap);
	pfree(sweep);
}

} // namespace idem

#endif
