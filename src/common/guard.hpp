// The one rule at the C++/PostgreSQL boundary.
//
// PostgreSQL reports errors with longjmp, which skips C++ destructors; a C++ exception must never
// unwind through PostgreSQL frames. So: code below an entry point holds nothing with a non-trivial
// destructor (memory is palloc'd, resources belong to PostgreSQL's resource owners), and every
// SQL-callable function is declared with IDEM_SQL_FUNCTION (and the background worker calls into
// core/ through run_guarded), which catches any C++ exception and raises it as an ereport once the
// exception object is gone.
#pragma once

#include "common/pg.hpp"

#include <exception>
#include <new>

namespace idem {

// Runs fn() and returns its result; a C++ exception it throws becomes an ERROR, raised once the
// exception object is gone. fn must hold nothing with a non-trivial destructor (a lambda capturing
// by reference does not).
template <typename Fn>
inline auto
run_guarded(Fn fn) -> decltype(fn())
{
	static char what[256];
	try
	{
		return fn();
	}
	catch (const std::bad_alloc &)
	{
		strlcpy(what, "out of memory", sizeof(what));
	}
	catch (const std::exception &e)
	{
		strlcpy(what, e.what(), sizeof(what));
	}
	catch (...)
	{
		strlcpy(what, "unknown exception", sizeof(what));
	}
	ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("idempotency: C++ exception: %s", what)));
	pg_unreachable();
}

using SqlFunction = Datum (*)(FunctionCallInfo);

inline Datum
call_guarded(SqlFunction fn, FunctionCallInfo fcinfo)
{
	return run_guarded([&] { return fn(fcinfo); });
}

} // namespace idem

// Declares an SQL-callable function NAME (extern "C", version-1 calling convention) whose body
// follows the macro and runs inside call_guarded.
#define IDEM_SQL_FUNCTION(name)                                                                    \
	extern "C" {                                                                               \
	PG_FUNCTION_INFO_V1(name);                                                                 \
	}                                                                                          \
	static Datum name##_body(PG_FUNCTION_ARGS);                                                \
	extern "C" Datum name(PG_FUNCTION_ARGS) { return idem::call_guarded(name##_body, fcinfo); } \
	static Datum name##_body(PG_FUNCTION_ARGS)
