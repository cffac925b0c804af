"""The SQL API from Python with psycopg 3 (Debian's python3-psycopg), without the client library
(clients/python wraps these calls): binding jsonb, bytea and arrays, reading results and enums,
catching SQLSTATEs and a batch error's failing key.

It connects with the libpq environment variables (PGHOST, PGPORT, PGUSER, PGDATABASE), prints one
line per check and exits 1 if any failed.
"""

import sys

import psycopg
from psycopg.types.json import Jsonb

failures = 0


def check(ok: bool, what: str, got: object = None) -> None:
    global failures
    if ok:
        print(f"ok: {what}")
    else:
        failures += 1
        print(f"FAILED: {what}; got: {got!r}")


def main() -> int:
    all_bytes = bytes(range(256))
    with psycopg.connect(autocommit=True) as conn:
        # jsonb: Jsonb(value); enums come back as str.
        row = conn.execute("SELECT outcome, state, attempt FROM idem_claim(%s, request => %s)",
                           ("order-1", Jsonb({"sku": "A-1", "qty": 2}))).fetchone()
        check(row == ("claimed", "pending", 1),
              "claim: outcome claimed, state pending, attempt 1 (enums read as text)", row)

        # bytea: bytes bind as bytea, every byte value kept; bytea results are bytes.
        row = conn.execute("SELECT state FROM idem_complete(%s, %s, 201, attempt => %s, body => %s)",
                           ("order-1", Jsonb({"order": 42}), 1, all_bytes)).fetchone()
        check(row == ("succeeded",), "complete with a jsonb response and a bytea body of all 256 byte values", row)

        row = conn.execute("""SELECT outcome, state, response, response_code, response_body
                                FROM idem_claim(%s, request => %s)""",
                           ("order-1", Jsonb({"qty": 2, "sku": "A-1"}))).fetchone()
        check(row is not None and row[:4] == ("replay", "succeeded", {"order": 42}, 201),
              "replay: outcome replay, state succeeded, the jsonb response (a dict) and code 201", row)
        check(row is not None and row[4] == all_bytes, "replay: response_body byte for byte (256 values)", row)

        row = conn.execute("SELECT response_body FROM idem_lookup(%s)", ("order-1",)).fetchone()
        check(row == (all_bytes,), "idem_lookup: response_body byte for byte", row)

        # IK001: the same key with another request.
        try:
            conn.execute("SELECT * FROM idem_claim(%s, request => %s)", ("order-1", Jsonb({"sku": "B-2"})))
            check(False, "same key, another request: SQLSTATE IK001", "no error")
        except psycopg.Error as e:
            check(e.sqlstate == "IK001", "same key, another request: SQLSTATE IK001", e.sqlstate)

        # IK004: the finished key completed again; 22023: a key with a newline.
        for sql, key, want, what in (("SELECT * FROM idem_complete(%s, NULL)", "order-1", "IK004",
                                      "the finished key completed again"),
                                     ("SELECT * FROM idem_claim(%s)", "bad\nkey", "22023", "a key with a newline")):
            try:
                conn.execute(sql, (key,))
                check(False, f"{what}: SQLSTATE {want}", "no error")
            except psycopg.Error as e:
                check(e.sqlstate == want, f"{what}: SQLSTATE {want}", e.sqlstate)

        # Arrays: a list of str binds as text[], of Jsonb as jsonb[], of bytes as bytea[].
        batch_key = 'b-2 {"x\\y"}'  # quotes, braces, a backslash and a space
        rows = conn.execute("SELECT key, outcome FROM idem_claim_batch(%s, requests => %s)",
                            (["b-1", batch_key], [Jsonb({"n": 1}), Jsonb({"n": 2})])).fetchall()
        check(rows == [("b-1", "claimed"), (batch_key, "claimed")],
              "batch claim with text[] keys and jsonb[] requests: both claimed, in key order", rows)

        fingerprints = [b'\x00\xff\\"', all_bytes[:64]]
        conn.execute("SELECT * FROM idem_claim_batch(%s, fingerprints => %s)", (["f-1", "f-2"], fingerprints))
        row = conn.execute("SELECT (idem_lookup('f-1')).fingerprint, (idem_lookup('f-2')).fingerprint").fetchone()
        check(row == tuple(fingerprints), "batch claim with bytea[] fingerprints: stored byte for byte", row)

        # A batch error names the failing key in the column-name field.
        try:
            conn.execute("SELECT * FROM idem_claim_batch(%s, requests => %s)",
                         (["b-3", batch_key], [Jsonb({"n": 3}), Jsonb({"n": 4})]))
            check(False, "batch with a reused key: IK001, e.diag.column_name is the failing key", "no error")
        except psycopg.Error as e:
            check((e.sqlstate, e.diag.column_name) == ("IK001", batch_key),
                  "batch with a reused key: IK001, e.diag.column_name is the failing key",
                  (e.sqlstate, e.diag.column_name))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
