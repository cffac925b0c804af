// From 18 the heap pulls the bitmap's pages itself (a read stream over the scan's iterator), so a
// sweep cannot skip pages as they come: the bitmap is split in two, the pages from `start` on and
// those before, and the heap walks one after the other.
#include "access/bitmapsweep.hpp"

#include "common/compat.hpp"

#if PG_VERSION_NUM >= 180000

namespace idem {

struct BitmapSweep
{
	TIDBitmap *sweeps[2];
	int current;
	TableScanDesc heap;
};

// Adds the page `page` of a bitmap to `into`: all of it when lossy, else its tuples.
static void
add_page(TIDBitmap *into, TBMIterateResult *page)
{
	if (page->lossy)
	{
		tbm_add_page(into, page->blockno);
		return;
	}
	OffsetNumber offsets[TBM_MAX_TUPLES_PER_PAGE];
	int n = tbm_extract_page_tuple(page, offsets, TBM_MAX_TUPLES_PER_PAGE);
	ItemPointerData tids[TBM_MAX_TUPLES_PER_PAGE];
	for (int i = 0; i < n; i++)
		ItemPointerSet(&tids[i], page->blockno, offsets[i]);
	tbm_add_tuples(into, tids, n, page->recheck);
}

BitmapSweep *
bitmap_sweep_begin(Relation rel, Snapshot snapshot, TIDBitmap *bitmap, BlockNumber start)
{
	BitmapSweep *sweep = static_cast<BitmapSweep *>(palloc0(sizeof(BitmapSweep)));
	if (start == 0)
		sweep->sweeps[0] = bitmap;
	else
	{
		Size limit = work_mem * INT64CONST(1024);
		sweep->sweeps[0] = tbm_create(limit, nullptr);
		sweep->sweeps[1] = tbm_create(limit, nullptr);
		TBMPrivateIterator *it = tbm_begin_private_iterate(bitmap);
		TBMIterateResult page;
		while (tbm_private_iterate(it, &page))
			add_page(sweep->sweeps[page.blockno >= start ? 0 : 1], &page);
		tbm_end_private_iterate(it);
		tbm_free(bitmap);
	}
	sweep->heap = compat::begin_bitmap_heap_scan(rel, snapshot);
	sweep->heap->st.rs_tbmiterator = tbm_begin_iterate(sweep->sweeps[0], nullptr, InvalidDsaPointer);
	return sweep;
}

static void
end_iteration(BitmapSweep *sweep)
{
	if (!tbm_exhausted(&sweep->heap->st.rs_tbmiterator))
		tbm_end_iterate(&sweep->heap->st.rs_tbmiterator);
}

bool
bitmap_sweep_next(BitmapSweep *sweep, TupleTableSlot *slot)
{
	for (;;)
	{
		bool recheck;
		uint64 lossy_pages = 0, exact_pages = 0;
		if (table_scan_bitmap_next_tuple(sweep->heap, slot, &recheck, &lossy_pages, &exact_pages))
			return true;
		if (sweep->current == 1 || sweep->sweeps[1] == nullptr)
			return false;
		end_iteration(sweep);
		table_rescan(sweep->heap, nullptr);
		sweep->current = 1;
		sweep->heap->st.rs_tbmiterator = tbm_begin_iterate(sweep->sweeps[1], nullptr, InvalidDsaPointer);
	}
}

void
bitmap_sweep_end(BitmapSweep *sweep)
{
	end_iteration(sweep);
	table_endscan(sweep->heap);
	for (TIDBitmap *bitmap : sweep->sweeps)
		if (bitmap != nullptr)
			tbm_free(bitmap);
	pfree(sweep);
}

} // namespace idem

#endif
