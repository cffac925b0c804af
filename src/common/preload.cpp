#include "common/preload.hpp"

#include "common/pg.hpp"

extern "C" {
#include "commands/extension.h"
}

namespace idem {

static bool preloaded = false;
static bool notice_given = false;

#define NOT_PRELOADED_MSG                                                                          \
	"the idempotency library is not preloaded: no background reaper, no statistics, and a claim's " \
	"wait => is not woken when the key is finished"
#define NOT_PRELOADED_HINT "Add idempotency to shared_preload_libraries in postgresql.conf and restart the server."

void
preload_note_loading()
{
	preloaded = process_shared_preload_libraries_in_progress;
	// The install or update script's first C function loads the library: the moment the extension
	// is set up is the one to say what it lacks. (A backend that had loaded it before says nothing.)
	if (!preloaded && creating_extension)
	{
		ereport(WARNING, (errcode(ERRCODE_WARNING), errmsg(NOT_PRELOADED_MSG), errhint(NOT_PRELOADED_HINT)));
		notice_given = true;
	}
}

void
preload_notice_if_missing()
{
	if (preloaded || notice_given)
		return;
	notice_given = true;
	ereport(NOTICE,
	        (errcode(ERRCODE_WARNING), errmsg(NOT_PRELOADED_MSG), errhint(NOT_PRELOADED_HINT)));
}

} // namespace idem
