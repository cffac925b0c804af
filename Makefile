# idempotency: PGXS build. `make && make install`, then `make installcheck` against a running
# server with shared_preload_libraries = 'idempotency' (the statistics tests need it);
# `scripts/test` runs every suite in throwaway clusters.

EXTENSION = idempotency
MODULE_big = idempotency
DATA = $(wildcard sql/idempotency--*.sql)
PGFILEDESC = "idempotency - idempotency keys for PostgreSQL"

SRCS = $(wildcard src/*.cpp src/*/*.cpp)
OBJS = $(SRCS:.cpp=.o)

# pg_regress: every sql/<name>.sql but the install scripts, compared with expected/<name>.out
REGRESS = $(filter-out idempotency--%,$(basename $(notdir $(wildcard sql/*.sql))))
REGRESS_OPTS = --load-extension=$(EXTENSION)
# isolation: test/isolation/specs/<name>.spec, compared with test/isolation/expected/<name>.out
ISOLATION = $(basename $(notdir $(wildcard test/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test/isolation --load-extension=$(EXTENSION)
# Perl TAP tests (PostgreSQL::Test::Cluster); they make their own clusters
TAP_TESTS = 1
PROVE_TESTS ?= $(wildcard test/t/*.pl)

# No LLVM bitcode for JIT inlining: it would need clang and buys nothing here. Set before the
# include so that PGXS's rules see it.
override with_llvm = no
# Rebuild objects when a header they include changes (dependency files in .deps/).
override autodepend = yes

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PostgreSQL's headers are system headers to us: -Werror applies to our code only.
PG_INCLUDES = -isystem $(includedir_server) -isystem $(includedir_internal)
override CPPFLAGS := -Isrc $(PG_INCLUDES) $(CPPFLAGS)
override CXXFLAGS := $(filter-out -Wmissing-format-attribute,$(CXXFLAGS)) -std=c++17 \
	-Wall -Wextra -Werror -Wno-missing-field-initializers
# libcrypto: SHA-256 of request fingerprints (src/common/sha256.cpp)
SHLIB_LINK += -lcrypto -lstdc++

.PHONY: test run bench
test:
	bash scripts/test
run:
	bash scripts/run
bench:
	bash bench/run

# The release archive (PGXN's format) of what git has committed at HEAD: idempotency-<version>.zip,
# its files under idempotency-<version>/. The version is the control file's default_version as a
# semantic version (1.5 -> 1.5.0), as META.json gives it (packaging/run-tests checks they agree).
DIST_VERSION = $(shell sed -n "s/^default_version = '\([0-9]*\.[0-9]*\)'$$/\1.0/p" $(EXTENSION).control)
DIST = $(EXTENSION)-$(DIST_VERSION)
.PHONY: dist
dist:
	git archive --format=zip --prefix=$(DIST)/ -o $(DIST).zip HEAD
	@echo "$(DIST).zip"
