// The launcher and the per-database reapers.
//
// The launcher is a static background worker, connected to no database (it reads only the shared
// catalog pg_database). Every idempotency.reaper_naptime it starts a dynamic reaper for each
// database that allows connections and is not a template (or each one named in
// idempotency.reaper_databases) unless one is already running there. A reaper connects to its
// database, leaves at once if the extension is not installed there (the launcher tries again a
// naptime later, which is how a database that gains the extension is picked up), and otherwise
// loops: a pass of batches, one short transaction per batch (idem::reap, no SPI), until a batch
// comes back short; then it sleeps a naptime.
//
// Crash and restart: the launcher has a restart interval, so the postmaster starts it again after a
// crash; reapers are BGW_NEVER_RESTART (the postmaster forgets them in a crash) and the fresh
// launcher starts them again. Which reaper serves which database is recorded in shared memory
// (reaper_claim), so a restarted launcher never doubles a reaper that is still running.
//
// These functions are entered from PostgreSQL (extern "C" main functions, a utility hook) and
// follow common/guard.hpp: no C++ objects with destructors, no exceptions escaping.
#include "worker/worker.hpp"

#include "common/compat.hpp"
#include "common/guard.hpp"
#include "common/settings.hpp"
#include "core/keystate.hpp"
#include "worker/reapers.hpp"

extern "C" {
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "commands/extension.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/backend_status.h"
#include "utils/varlena.h"
#include "utils/wait_event.h"

PGDLLEXPORT void idem_launcher_main(Datum main_arg);
PGDLLEXPORT void idem_reaper_main(Datum main_arg);
}

#include <csignal>

namespace idem {

static constexpr const char *library_name = "idempotency";
static constexpr int launcher_restart_s = 5;
static constexpr int max_tracked = 1024;

// ---------------------------------------------------------------------------------------------
// Settings shared by both workers

// Is the database named in idempotency.reaper_databases (or is the list empty)? A list that does
// not parse is reported and treated as naming no database.
static bool
database_selected(const char *datname)
{
	if (setting_reaper_databases == nullptr || setting_reaper_databases[0] == '\0')
		return true;
	char *raw = pstrdup(setting_reaper_databases);
	List *names = NIL;
	bool selected = false;
	if (!SplitIdentifierString(raw, ',', &names))
		ereport(WARNING, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
		                  errmsg("invalid list syntax in parameter \"idempotency.reaper_databases\"")));
	else
	{
		ListCell *lc;
		foreach (lc, names)
			if (strcmp(static_cast<const char *>(lfirst(lc)), datname) == 0)
				selected = true;
	}
	list_free(names);
	pfree(raw);
	return selected;
}

static void
reload_settings_if_asked()
{
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
	}
}

static long
naptime_ms()
{
	return static_cast<long>(setting_reaper_naptime_s) * 1000L;
}

// The loop of both workers: at every wake-up (latch, SIGHUP, timeout) `on_wake`, which may exit;
// at once and then every naptime, measured from the end of the last one, `work`.
template <typename OnWake, typename Work>
static void
naptime_loop(OnWake on_wake, Work work)
{
	TimestampTz last_work = 0;
	bool worked = false;
	for (;;)
	{
		if (ProcDiePending)
			proc_exit(0);
		CHECK_FOR_INTERRUPTS();
		reload_settings_if_asked();
		on_wake();

		TimestampTz now = GetCurrentTimestamp();
		long wait = naptime_ms();
		if (!worked || TimestampDifferenceExceeds(last_work, now, static_cast<int>(wait)))
		{
			work();
			last_work = GetCurrentTimestamp();
			worked = true;
		}
		else
			wait -= TimestampDifferenceMilliseconds(last_work, now);

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, Max(wait, 1L),
		                 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

// ---------------------------------------------------------------------------------------------
// Launcher

struct Tracked
{
	Oid dboid;
	BackgroundWorkerHandle *handle; // in TopMemoryContext
};

static Tracked tracked[max_tracked];
static int ntracked = 0;
static bool warned_no_slot = false;

struct Candidate
{
	Oid dboid;
	NameData datname;
};

// The databases a reaper should look at, allocated in the caller's memory context.
static Candidate *
list_databases(int *count)
{
	MemoryContext caller = CurrentMemoryContext;
	int capacity = 16, n = 0;
	Candidate *result = static_cast<Candidate *>(palloc(capacity * sizeof(Candidate)));

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	Relation rel = table_open(DatabaseRelationId, AccessShareLock);
	TableScanDesc scan = table_beginscan_catalog(rel, 0, nullptr);
	HeapTuple tuple;
	while (HeapTupleIsValid(tuple = heap_getnext(scan, ForwardScanDirection)))
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tuple);
		if (db->datistemplate || !db->datallowconn || database_is_invalid_form(db))
			continue;
		if (!database_selected(NameStr(db->datname)))
			continue;
		MemoryContext old = MemoryContextSwitchTo(caller);
		if (n == capacity)
		{
			capacity *= 2;
			result = static_cast<Candidate *>(repalloc(result, capacity * sizeof(Candidate)));
		}
		result[n].dboid = db->oid;
		result[n].datname = db->datname;
		n++;
		MemoryContextSwitchTo(old);
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	*count = n;
	return result;
}

static Tracked *
tracked_for(Oid dboid)
{
	for (int i = 0; i < ntracked; i++)
		if (tracked[i].dboid == dboid)
			return &tracked[i];
	if (ntracked == max_tracked)
		return nullptr;
	tracked[ntracked].dboid = dboid;
	tracked[ntracked].handle = nullptr;
	return &tracked[ntracked++];
}

static bool
running(const Tracked *t)
{
	pid_t pid;
	return t->handle != nullptr && GetBackgroundWorkerPid(t->handle, &pid) != BGWH_STOPPED;
}

static void
start_reaper(Tracked *t, const char *datname)
{
	BackgroundWorker bgw;
	memset(&bgw, 0, sizeof(bgw));
	bgw.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	bgw.bgw_start_time = BgWorkerStart_RecoveryFinished;
	bgw.bgw_restart_time = BGW_NEVER_RESTART; // the launcher restarts it
	strlcpy(bgw.bgw_library_name, library_name, BGW_MAXLEN);
	strlcpy(bgw.bgw_function_name, "idem_reaper_main", BGW_MAXLEN);
	snprintf(bgw.bgw_name, BGW_MAXLEN, "idempotency reaper for database \"%s\"", datname);
	strlcpy(bgw.bgw_type, "idempotency reaper", BGW_MAXLEN);
	bgw.bgw_main_arg = ObjectIdGetDatum(t->dboid);
	bgw.bgw_notify_pid = 0;

	BackgroundWorkerHandle *handle;
	MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
	bool ok = RegisterDynamicBackgroundWorker(&bgw, &handle);
	MemoryContextSwitchTo(old);
	if (!ok)
	{
		if (!warned_no_slot)
			ereport(WARNING, (errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
			                  errmsg("idempotency launcher: could not start a reaper for database \"%s\"", datname),
			                  errhint("Raise max_worker_processes: the reaper needs one worker per database "
			                          "that it serves, plus one for its launcher.")));
		warned_no_slot = true;
		return;
	}
	warned_no_slot = false;
	if (t->handle != nullptr)
		pfree(t->handle);
	t->handle = handle;
}

static void
launch_reapers(MemoryContext scratch)
{
	MemoryContextReset(scratch);
	MemoryContext old = MemoryContextSwitchTo(scratch);
	int n;
	Candidate *dbs = list_databases(&n);
	for (int i = 0; i < n; i++)
	{
		Tracked *t = tracked_for(dbs[i].dboid);
		if (t == nullptr || running(t) || reaper_pid(dbs[i].dboid) != 0)
			continue;
		start_reaper(t, NameStr(dbs[i].datname));
	}
	MemoryContextSwitchTo(old);
}

static void
launcher_loop()
{
	MemoryContext scratch =
	    AllocSetContextCreate(TopMemoryContext, "idempotency launcher", ALLOCSET_DEFAULT_SIZES);
	naptime_loop([] {},
	             [&] {
		             if (setting_reaper_enabled)
			             launch_reapers(scratch);
	             });
}

// ---------------------------------------------------------------------------------------------
// Reaper

static char *my_datname = nullptr; // in TopMemoryContext

// One pass: batches until one comes back short. False if the extension is not installed here.
static bool
reap_pass()
{
	int64 total = 0;
	int batches = 0;
	TimestampTz started = GetCurrentTimestamp();
	for (;;)
	{
		int32 batch = setting_reaper_batch_size;
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		if (batches == 0 && !OidIsValid(get_extension_oid("idempotency", true)))
		{
			PopActiveSnapshot();
			CommitTransactionCommand();
			return false;
		}
		pgstat_report_activity(STATE_RUNNING, "idempotency reaper: deleting expired keys");
		int64 n = run_guarded([&] { return reap(batch); });
		PopActiveSnapshot();
		CommitTransactionCommand();
		total += n;
		batches++;
		if (n < batch)
			break;
		CHECK_FOR_INTERRUPTS();
		reload_settings_if_asked();
		if (!setting_reaper_enabled)
			break;
	}
	pgstat_report_stat(true);
	pgstat_report_activity(STATE_IDLE, nullptr);
	long ms = TimestampDifferenceMilliseconds(started, GetCurrentTimestamp());
	ereport(total > 0 ? setting_reaper_log_level : DEBUG1,
	        (errmsg("idempotency reaper: deleted %lld expired keys in database \"%s\" "
	                "(%d batches, %ld ms)",
	                static_cast<long long>(total), my_datname, batches, ms),
	         errhidestmt(true)));
	return true;
}

static void
reaper_loop()
{
	naptime_loop(
	    [] {
		    if (!setting_reaper_enabled || !database_selected(my_datname))
		    {
			    ereport(DEBUG1, (errmsg("idempotency reaper for database \"%s\": disabled by the settings, exiting",
			                            my_datname)));
			    proc_exit(0);
		    }
	    },
	    [] {
		    if (!reap_pass())
		    {
			    ereport(DEBUG1, (errmsg("idempotency reaper: extension \"idempotency\" is not installed in "
			                            "database \"%s\", exiting",
			                            my_datname)));
			    proc_exit(0);
		    }
	    });
}

static void
reaper_main(Oid dboid)
{
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	SetConfigOption("application_name", "idempotency reaper", PGC_USERSET, PGC_S_SESSION);

	StartTransactionCommand();
	char *name = get_database_name(dboid);
	my_datname = MemoryContextStrdup(TopMemoryContext, name != nullptr ? name : "?");
	CommitTransactionCommand();

	if (!reaper_claim(dboid))
	{
		ereport(DEBUG1, (errmsg("idempotency reaper: database \"%s\" already has a reaper", my_datname)));
		proc_exit(0);
	}
	reaper_loop();
}

// ---------------------------------------------------------------------------------------------
// DROP DATABASE, ALTER DATABASE ... RENAME / SET TABLESPACE and CREATE DATABASE ... TEMPLATE need
// the database to themselves: ask its reaper to leave first (they wait up to 5 s for that). The
// launcher starts a reaper again a naptime later if the database is still there.

static ProcessUtility_hook_type prev_utility_hook = nullptr;

static const char *
option_value(List *options, const char *name)
{
	ListCell *lc;
	foreach (lc, options)
	{
		DefElem *d = static_cast<DefElem *>(lfirst(lc));
		if (strcmp(d->defname, name) == 0 && d->arg != nullptr)
			return defGetString(d);
	}
	return nullptr;
}

static bool
has_option(List *options, const char *name)
{
	ListCell *lc;
	foreach (lc, options)
		if (strcmp(static_cast<DefElem *>(lfirst(lc))->defname, name) == 0)
			return true;
	return false;
}

static const char *
database_needing_exclusive_use(Node *stmt)
{
	switch (nodeTag(stmt))
	{
	case T_DropdbStmt:
		return castNode(DropdbStmt, stmt)->dbname;
	case T_RenameStmt:
		return castNode(RenameStmt, stmt)->renameType == OBJECT_DATABASE
		           ? castNode(RenameStmt, stmt)->subname
		           : nullptr;
	case T_AlterDatabaseStmt:
		return has_option(castNode(AlterDatabaseStmt, stmt)->options, "tablespace")
		           ? castNode(AlterDatabaseStmt, stmt)->dbname
		           : nullptr;
	case T_CreatedbStmt:
		return option_value(castNode(CreatedbStmt, stmt)->options, "template");
	default:
		return nullptr;
	}
}

static void
utility_hook(PlannedStmt *pstmt, const char *query_string, bool read_only_tree,
             ProcessUtilityContext context, ParamListInfo params, QueryEnvironment *query_env,
             DestReceiver *dest, QueryCompletion *qc)
{
	const char *datname = database_needing_exclusive_use(pstmt->utilityStmt);
	if (datname != nullptr && IsTransactionState())
	{
		Oid dboid = get_database_oid(datname, true);
		// Only for someone who may do this to the database: nobody else stops a reaper.
		if (OidIsValid(dboid) && compat::owns_database(dboid, GetUserId()))
		{
			int pid = reaper_pid(dboid);
			if (pid != 0)
				(void) kill(pid, SIGTERM);
		}
	}
	if (prev_utility_hook)
		prev_utility_hook(pstmt, query_string, read_only_tree, context, params, query_env, dest, qc);
	else
		standard_ProcessUtility(pstmt, query_string, read_only_tree, context, params, query_env,
		                        dest, qc);
}

// ---------------------------------------------------------------------------------------------

void
worker_register()
{
	BackgroundWorker bgw;
	memset(&bgw, 0, sizeof(bgw));
	bgw.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	bgw.bgw_start_time = BgWorkerStart_RecoveryFinished;
	bgw.bgw_restart_time = launcher_restart_s;
	strlcpy(bgw.bgw_library_name, library_name, BGW_MAXLEN);
	strlcpy(bgw.bgw_function_name, "idem_launcher_main", BGW_MAXLEN);
	strlcpy(bgw.bgw_name, "idempotency launcher", BGW_MAXLEN);
	strlcpy(bgw.bgw_type, "idempotency launcher", BGW_MAXLEN);
	RegisterBackgroundWorker(&bgw);

	prev_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = utility_hook;
}

} // namespace idem

void
idem_launcher_main(Datum)
{
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
	SetConfigOption("application_name", "idempotency launcher", PGC_USERSET, PGC_S_SESSION);
	ereport(DEBUG1, (errmsg("idempotency launcher started")));
	idem::launcher_loop();
}

void
idem_reaper_main(Datum main_arg)
{
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	idem::reaper_main(DatumGetObjectId(main_arg));
}
