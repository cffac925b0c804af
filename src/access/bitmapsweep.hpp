// The expiry scan's walk over the heap pages of a bitmap (from a BRIN index), in two sweeps: the
// pages from block `start` on, then those before it. How the heap gives up a bitmap's pages differs
// between majors (page by page until 17, a read stream from 18): one file for each.
#pragma once

#include "common/pg.hpp"

extern "C" {
#include "nodes/tidbitmap.h"
}

namespace idem {

struct BitmapSweep;

// Takes `bitmap` over (bitmap_sweep_end frees it).
BitmapSweep *bitmap_sweep_begin(Relation rel, Snapshot snapshot, TIDBitmap *bitmap, BlockNumber start);
// The next tuple the snapshot sees on the bitmap's pages (all of a lossy page's: the caller
// rechecks), into slot; false when both sweeps are done.
bool bitmap_sweep_next(BitmapSweep *sweep, TupleTableSlot *slot);
void bitmap_sweep_end(BitmapSweep *sweep);

} // namespace idem
