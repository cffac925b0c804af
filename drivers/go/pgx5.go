//go:build pgx5

// pgx v5 (Debian's golang-github-jackc-pgx-v5-dev, built with -tags pgx5): main.go's calls are
// the same in v4 and v5; only the import paths differ.
package main

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var connect = pgx.Connect

type pgError = pgconn.PgError
