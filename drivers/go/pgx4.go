//go:build !pgx5

// pgx v4 (Debian bookworm's golang-github-jackc-pgx-v4-dev): main.go's calls are the same in v4
// and v5; only the import paths differ.
package main

import (
	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
)

var connect = pgx.Connect

type pgError = pgconn.PgError
