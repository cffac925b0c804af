// The SQL API from Go with pgx, v4 or v5: binding jsonb, bytea and arrays, reading results and
// enums, catching SQLSTATEs and a batch error's failing key. Every call here is written the same
// way in both versions; pgx4.go (the default) and pgx5.go (-tags pgx5) import the one to build
// with. It connects with the libpq environment variables (PGHOST, PGPORT, PGUSER, PGDATABASE),
// prints one line per check and exits 1 if any failed.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
)

var failures int

func check(ok bool, what string, got ...any) {
	if ok {
		fmt.Println("ok:", what)
		return
	}
	failures++
	fmt.Println("FAILED:", what, "; got:", fmt.Sprint(got...))
}

// sqlstate is the SQLSTATE of a server error, "" for anything else.
func sqlstate(err error) string {
	var pgErr *pgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

func main() {
	ctx := context.Background()
	conn, err := connect(ctx, "")
	if err != nil {
		fmt.Println("FAILED: connect:", err)
		os.Exit(1)
	}

	allBytes := make([]byte, 256)
	for i := range allBytes {
		allBytes[i] = byte(i)
	}

	// jsonb: a string binds as jsonb; enums scan into a string.
	var outcome, state string
	var attempt int32
	err = conn.QueryRow(ctx, `SELECT outcome, state, attempt FROM idem_claim($1, request => $2)`,
		"order-1", `{"sku": "A-1", "qty": 2}`).Scan(&outcome, &state, &attempt)
	check(err == nil && outcome == "claimed" && state == "pending" && attempt == 1,
		"claim: outcome claimed, state pending, attempt 1 (enums read as text)", err, outcome, state, attempt)

	// bytea: a []byte binds as bytea, every byte value kept.
	err = conn.QueryRow(ctx, `SELECT state FROM idem_complete($1, $2, 201, attempt => $3, body => $4)`,
		"order-1", `{"order": 42}`, attempt, allBytes).Scan(&state)
	check(err == nil && state == "succeeded", "complete with a jsonb response and a bytea body of all 256 byte values", err, state)

	var response string
	var code int32
	var body []byte
	err = conn.QueryRow(ctx, `SELECT outcome, state, response, response_code, response_body
	                            FROM idem_claim($1, request => $2)`,
		"order-1", `{"qty": 2, "sku": "A-1"}`).Scan(&outcome, &state, &response, &code, &body)
	check(err == nil && outcome == "replay" && state == "succeeded" && response == `{"order": 42}` && code == 201,
		"replay: outcome replay, state succeeded, the jsonb response and code 201", err, outcome, state, response, code)
	check(bytes.Equal(body, allBytes), "replay: response_body byte for byte (256 values)", len(body))

	body = nil
	err = conn.QueryRow(ctx, `SELECT response_body FROM idem_lookup($1)`, "order-1").Scan(&body)
	check(err == nil && bytes.Equal(body, allBytes), "idem_lookup: response_body byte for byte", err, len(body))

	// IK001: the same key with another request.
	_, err = conn.Exec(ctx, `SELECT * FROM idem_claim($1, request => $2)`, "order-1", `{"sku": "B-2"}`)
	check(sqlstate(err) == "IK001", "same key, another request: SQLSTATE IK001", err)

	// IK004: the finished key completed again; 22023: a key with a newline (not printable ASCII).
	_, err = conn.Exec(ctx, `SELECT * FROM idem_complete($1, NULL)`, "order-1")
	check(sqlstate(err) == "IK004", "the finished key completed again: SQLSTATE IK004", err)
	_, err = conn.Exec(ctx, `SELECT * FROM idem_claim($1)`, "bad\nkey")
	check(sqlstate(err) == "22023", "a key with a newline: SQLSTATE 22023", err)

	// Arrays: []string binds as text[] and as jsonb[], [][]byte as bytea[].
	batchKey := `b-2 {"x\y"}` // quotes, braces, a backslash and a space: escaped by the driver
	rows, err := conn.Query(ctx, `SELECT key, outcome FROM idem_claim_batch($1, requests => $2)`,
		[]string{"b-1", batchKey}, []string{`{"n": 1}`, `{"n": 2}`})
	var got []string
	if err == nil {
		for rows.Next() {
			var key string
			if err = rows.Scan(&key, &outcome); err != nil {
				break
			}
			got = append(got, key+"="+outcome)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	check(err == nil && len(got) == 2 && got[0] == "b-1=claimed" && got[1] == batchKey+"=claimed",
		"batch claim with text[] keys and jsonb[] requests: both claimed, in key order", err, got)

	fingerprints := [][]byte{{0x00, 0xff, 0x5c, 0x22}, allBytes[:64]}
	_, err = conn.Exec(ctx, `SELECT * FROM idem_claim_batch($1, fingerprints => $2)`,
		[]string{"f-1", "f-2"}, fingerprints)
	var fp1, fp2 []byte
	if err == nil {
		err = conn.QueryRow(ctx, `SELECT (idem_lookup('f-1')).fingerprint, (idem_lookup('f-2')).fingerprint`).Scan(&fp1, &fp2)
	}
	check(err == nil && bytes.Equal(fp1, fingerprints[0]) && bytes.Equal(fp2, fingerprints[1]),
		"batch claim with bytea[] fingerprints: stored byte for byte", err, fp1, fp2)

	// A batch error names the failing key in the column-name field.
	_, err = conn.Exec(ctx, `SELECT * FROM idem_claim_batch($1, requests => $2)`,
		[]string{"b-3", batchKey}, []string{`{"n": 3}`, `{"n": 4}`})
	var pgErr *pgError
	check(errors.As(err, &pgErr) && pgErr.Code == "IK001" && pgErr.ColumnName == batchKey,
		"batch with a reused key: IK001, ColumnName is the failing key", err)

	conn.Close(ctx)
	if failures > 0 {
		os.Exit(1)
	}
}
