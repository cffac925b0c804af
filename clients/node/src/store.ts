import type { Pool, PoolClient, QueryResultRow } from 'pg';
import {
  IdempotencyError,
  OpenTransactionError,
  UnsupportedVersionError,
  translateError,
} from './errors';
import { beginAndQuery } from './protocol';

/** Something that runs a query: the pool (autocommit) or a checked-out client. */
export type Queryable = Pick<Pool, 'query'> | PoolClient;

/** A duration: milliseconds, or PostgreSQL interval text such as `'30 seconds'`. */
export type Duration = number | string;

export type KeyState = 'pending' | 'succeeded' | 'failed';
export type ClaimOutcome = 'claimed' | 'replay' | 'in_progress';

export interface ClaimOptions {
  key: string;
  /** `''` when omitted. */
  scope?: string;
  /** The request, fingerprinted by the server (SHA-256 of the scope and the canonical jsonb). */
  request?: unknown;
  /** A fingerprint you computed yourself (1..64 bytes); wins over `request`. */
  fingerprint?: Buffer;
  ttl?: Duration;
  lease?: Duration;
  /** 1.2: wait at most this long for an in-flight owner of the key before answering in_progress. */
  wait?: Duration;
}

export interface ClaimResult {
  outcome: ClaimOutcome;
  inserted: boolean;
  /** The fencing token; null only for a 1.2 in_progress on a not yet committed claim. */
  attempt: number | null;
  state: KeyState | null;
  response: unknown;
  responseCode: number | null;
  /** 1.2: the stored bytes (idem_complete's `body`). */
  responseBody: Buffer | null;
  /** 1.2: the stored response headers. */
  responseHeaders: Record<string, string | string[]> | null;
  /** in_progress: time until the owner's lease ends, in milliseconds. */
  retryAfterMs: number | null;
  /** in_progress: whole seconds for an HTTP Retry-After header (retry_after_s in 1.2). */
  retryAfterSeconds: number | null;
  expiresAt: Date | null;
}

export interface FinishOptions {
  key: string;
  scope?: string;
  /** The attempt you were given by the claim (lease mode); fences off a stale worker (IK002). */
  attempt?: number;
  response?: unknown;
  responseCode?: number;
  /** 1.2: how long to keep the result, counted from now. */
  ttl?: Duration;
  /** 1.2: the exact response bytes to replay. */
  body?: Buffer | string;
  /** 1.2: the response headers to replay. */
  headers?: Record<string, string | string[]>;
}

export interface FailOptions extends FinishOptions {
  /** May a later claim take the key over (default true). */
  retryable?: boolean;
}

export interface LeaseOptions {
  key: string;
  scope?: string;
  attempt: number;
}

/** A row of idem_keys, as idem_complete, idem_fail, idem_extend and idem_lookup return it. */
export interface KeyRow {
  scope: string;
  key: string;
  state: KeyState;
  attempt: number;
  response: unknown;
  responseCode: number | null;
  retryable: boolean | null;
  createdAt: Date;
  lockedUntil: Date | null;
  completedAt: Date | null;
  expiresAt: Date;
}

export interface StoreOptions {
  /** Prefix of the prepared statements' names (one set per store on each connection). */
  statementPrefix?: string;
}

interface Installed {
  version: string;
  /** Quoted schema of the extension: calls never depend on search_path. */
  schema: string;
  hasV12: boolean;
  /** Statement texts, built once per store from the version and the schema. */
  sql: Statements;
}

interface Statements {
  claim: string;
  complete: string;
  fail: string;
  recordComplete: string;
  recordFail: string;
  extend: string;
  release: string;
  lookup: string;
}

/** The texts of every statement the store sends, for one installed version and schema. */
function statements(schema: string, hasV12: boolean): Statements {
  const claimColumns = hasV12
    ? `c.response_body, c.response_headers, c.retry_after_s`
    : `NULL::bytea AS response_body, NULL::jsonb AS response_headers, NULL::integer AS retry_after_s`;
  const claimArguments =
    `$1, request => $2::jsonb, scope => $3, ttl => $4::interval, lease => $5::interval, fingerprint => $6::bytea` +
    (hasV12 ? `, wait => $7::interval` : '');
  const finishArguments = (fn: 'complete' | 'fail') => {
    let args = `$1, $2::jsonb, $3, scope => $4, attempt => $5`;
    let n = 5;
    if (fn === 'fail') args += `, retryable => $${++n}`;
    if (hasV12) args += `, ttl => $${++n}::interval, body => $${++n}::bytea, headers => $${++n}::jsonb`;
    return args;
  };
  return {
    claim:
      `SELECT c.outcome::text AS outcome, c.inserted, c.attempt, c.state::text AS state, c.response,
              c.response_code, ${claimColumns},
              (extract(epoch FROM c.retry_after) * 1000)::float8 AS retry_after_ms, c.expires_at
         FROM ${schema}.idem_claim(${claimArguments}) AS c`,
    complete: `SELECT * FROM ${schema}.idem_complete(${finishArguments('complete')})`,
    fail: `SELECT * FROM ${schema}.idem_fail(${finishArguments('fail')})`,
    // the runners and the middleware do not use the finished row: no columns to send and parse
    recordComplete: `SELECT FROM ${schema}.idem_complete(${finishArguments('complete')})`,
    recordFail: `SELECT FROM ${schema}.idem_fail(${finishArguments('fail')})`,
    extend: `SELECT * FROM ${schema}.idem_extend($1, attempt => $2, lease => $3::interval, scope => $4)`,
    release: `SELECT * FROM ${schema}.idem_release($1, attempt => $2, scope => $3)`,
    lookup: `SELECT * FROM ${schema}.idem_lookup($1, scope => $2)`,
  };
}

const V12 = '1.2';

/**
 * The extension's SQL API, typed: each method is one statement. Reads the installed version once
 * (`pg_extension.extversion`); features of 1.2 on a 1.1 database raise UnsupportedVersionError.
 */
export class IdempotencyStore {
  readonly pool: Pool;
  private installed: Promise<Installed> | undefined;
  /** The same, once known: later calls skip the promise. */
  private known: Installed | undefined;
  private readonly prefix: string;

  constructor(pool: Pool, options: StoreOptions = {}) {
    this.pool = pool;
    this.prefix = options.statementPrefix ?? 'idem';
  }

  /** The installed extension version, e.g. "1.1". */
  async version(): Promise<string> {
    return (await this.extension()).version;
  }

  /** Whether the database has 1.2's functions (idem_extend, idem_release, wait, body, headers). */
  async supportsV12(): Promise<boolean> {
    return (await this.extension()).hasV12;
  }

  async claim(db: Queryable, options: ClaimOptions): Promise<ClaimResult> {
    const ext = this.known ?? (await this.extension());
    const row = await this.one(db, 'claim', ext.sql.claim, this.claimParams(ext, options));
    return claimResult(row);
  }

  /**
   * Same-transaction mode's start: `BEGIN` (with `isolationLevel`), the claim and, when named, a
   * `savepoint` after it, in one exchange with the server, so that a replay or a 409 is known
   * after one round trip (src/protocol.ts). The claim's parameters are bound as usual (never spliced into the statement text, so neither the server
   * log nor the parser ever sees them). `client` must not be in a transaction; after an error
   * the transaction is open and aborted: roll it back.
   */
  async beginAndClaim(client: PoolClient, options: ClaimOptions, isolationLevel?: string, savepoint?: string): Promise<ClaimResult> {
    const ext = this.known ?? (await this.extension());
    const params = this.claimParams(ext, options);
    const begin = isolationLevel ? `BEGIN ISOLATION LEVEL ${isolationLevel}` : 'BEGIN';
    const after = savepoint === undefined ? undefined : `SAVEPOINT ${savepoint}`;
    if ((client as { pipeline?: boolean }).pipeline) {
      // a pipelining client refuses custom query objects, and sends them all at once anyway
      const started = client.query(begin);
      const claimed = this.one(client, 'claim', ext.sql.claim, params);
      const saved = after === undefined ? undefined : client.query(after);
      await started.catch(() => undefined); // the claim reports the same failure
      const row = await claimed;
      await saved;
      return claimResult(row);
    }
    try {
      return claimResult(await beginAndQuery(client, begin, `${this.prefix}_claim_${params.length}`, ext.sql.claim, params, after));
    } catch (err) {
      throw translateError(err);
    }
  }

  private claimParams(ext: Installed, options: ClaimOptions): unknown[] {
    if (options.wait !== undefined) this.require(ext, 'the claim option "wait"');
    const params: unknown[] = [
      options.key,
      options.request === undefined ? null : jsonParam(options.request),
      options.scope ?? '',
      intervalParam(options.ttl),
      intervalParam(options.lease),
      options.fingerprint ?? null,
    ];
    if (ext.hasV12) params.push(intervalParam(options.wait));
    return params;
  }

  async complete(db: Queryable, options: FinishOptions): Promise<KeyRow> {
    return keyRow(await this.finish(db, 'complete', options, true));
  }

  async fail(db: Queryable, options: FailOptions): Promise<KeyRow> {
    return keyRow(await this.finish(db, 'fail', options, true));
  }

  /** `complete` or `fail` without reading the finished row back (what the runners need). */
  async record(db: Queryable, outcome: 'complete' | 'fail', options: FailOptions): Promise<void> {
    await this.finish(db, outcome, options, false);
  }

  /** 1.2: heartbeat of the owner (`locked_until = now + lease`). */
  async extend(db: Queryable, options: LeaseOptions & { lease: Duration }): Promise<KeyRow> {
    const ext = this.known ?? (await this.extension());
    this.require(ext, 'idem_extend (lease heartbeat)');
    const row = await this.one(
      db,
      'extend',
      ext.sql.extend,
      [options.key, options.attempt, intervalParam(options.lease), options.scope ?? ''],
    );
    return keyRow(row);
  }

  /** 1.2: the owner gives the key up without a result; the next claim takes it over at once. */
  async release(db: Queryable, options: LeaseOptions): Promise<KeyRow> {
    const ext = this.known ?? (await this.extension());
    this.require(ext, 'idem_release');
    const row = await this.one(
      db,
      'release',
      ext.sql.release,
      [options.key, options.attempt, options.scope ?? ''],
    );
    return keyRow(row);
  }

  /** The committed row, or null (idem_lookup's row of NULLs becomes null). */
  async lookup(db: Queryable, options: { key: string; scope?: string }): Promise<KeyRow | null> {
    const ext = this.known ?? (await this.extension());
    const row = await this.one(db, 'lookup', ext.sql.lookup, [
      options.key,
      options.scope ?? '',
    ]);
    return row.key === null ? null : keyRow(row);
  }

  /** Throws OpenTransactionError when `client` is inside a transaction block (lease mode needs autocommit). */
  assertAutocommit(client: PoolClient): void {
    const status = (client as { getTransactionStatus?: () => string | null }).getTransactionStatus?.();
    if (status === undefined) {
      throw new OpenTransactionError('lease mode cannot check the transaction status: pg 8.23 or later is required', 500);
    }
    if (status === 'T' || status === 'E') {
      throw new OpenTransactionError(
        'lease mode claims in autocommit: the connection has an open transaction ' +
          '(duplicates would wait on the row instead of getting in_progress)',
        500,
      );
    }
  }

  private async finish(db: Queryable, fn: 'complete' | 'fail', options: FailOptions, readRow: boolean): Promise<QueryResultRow> {
    const ext = this.known ?? (await this.extension());
    const v12Only = options.ttl !== undefined || options.body !== undefined || options.headers !== undefined;
    if (v12Only && !ext.hasV12) this.require(ext, `idem_${fn} with ttl, body or headers`);
    const params: unknown[] = [
      options.key,
      options.response === undefined || options.response === null ? null : jsonParam(options.response),
      options.responseCode ?? (fn === 'complete' ? 200 : 500),
      options.scope ?? '',
      options.attempt ?? null,
    ];
    if (fn === 'fail') params.push(options.retryable ?? true);
    if (ext.hasV12) {
      params.push(
        intervalParam(options.ttl),
        options.body === undefined ? null : typeof options.body === 'string' ? Buffer.from(options.body) : options.body,
        options.headers === undefined ? null : jsonParam(options.headers),
      );
    }
    const what = readRow ? fn : fn === 'complete' ? 'recordComplete' : 'recordFail';
    return this.one(db, what, ext.sql[what], params);
  }

  private require(ext: Installed, feature: string): void {
    if (!ext.hasV12) throw new UnsupportedVersionError(feature, V12, ext.version);
  }

  private extension(): Promise<Installed> {
    if (!this.installed) {
      this.installed = this.pool
        .query(
          // The SQL edition installed as plain SQL (docs/editions.md) is no extension: its schema
          // is the one of its version table idem_sql_version that search_path finds (as the
          // application's own unqualified names are), its version that table's row.
          `SELECT e.extversion, quote_ident(n.nspname) AS schema
             FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
            WHERE e.extname = 'idempotency'
           UNION ALL
           SELECT (pg_catalog.xpath('/row/version/text()', pg_catalog.query_to_xml(
                     pg_catalog.format('SELECT version FROM %I.idem_sql_version', n.nspname), false, true, '')))[1]::text,
                  quote_ident(n.nspname)
             FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
            WHERE c.oid = pg_catalog.to_regclass('idem_sql_version')
              AND NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'idempotency')`,
        )
        .then((result) => {
          const row = result.rows[0];
          if (!row) {
            throw new IdempotencyError('the idempotency extension is not installed in this database', 500);
          }
          const hasV12 = compareVersions(row.extversion as string, V12) >= 0;
          this.known = {
            version: row.extversion as string,
            schema: row.schema as string,
            hasV12,
            sql: statements(row.schema as string, hasV12),
          };
          return this.known;
        });
      // a failed look-up (database down) is tried again on the next call
      this.installed.catch(() => {
        this.installed = undefined;
      });
    }
    return this.installed;
  }

  private async one(db: Queryable, what: string, text: string, values: unknown[]): Promise<QueryResultRow> {
    try {
      const result = await db.query({ name: `${this.prefix}_${what}_${values.length}`, text, values });
      return result.rows[0];
    } catch (err) {
      throw translateError(err);
    }
  }
}

function compareVersions(a: string, b: string): number {
  const pa = a.split('.').map(Number);
  const pb = b.split('.').map(Number);
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    const d = (pa[i] ?? 0) - (pb[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

/** JSON text for a jsonb parameter (pg would turn a JS array into a PostgreSQL array literal). */
function jsonParam(value: unknown): string {
  return JSON.stringify(value);
}

function intervalParam(value: Duration | undefined): string | null {
  if (value === undefined) return null;
  if (typeof value === 'string') return value;
  if (!Number.isFinite(value)) throw new TypeError(`a duration must be a finite number of milliseconds, not ${value}`);
  return `${value} milliseconds`;
}

function keyRow(row: QueryResultRow): KeyRow {
  return {
    scope: row.scope,
    key: row.key,
    state: row.state,
    attempt: row.attempt,
    response: row.response,
    responseCode: row.response_code,
    retryable: row.retryable,
    createdAt: row.created_at,
    lockedUntil: row.locked_until,
    completedAt: row.completed_at,
    expiresAt: row.expires_at,
  };
}

function claimResult(row: QueryResultRow): ClaimResult {
  const retryAfterMs = row.retry_after_ms as number | null;
  return {
    outcome: row.outcome as ClaimOutcome,
    inserted: row.inserted as boolean,
    attempt: row.attempt as number | null,
    state: row.state as KeyState | null,
    response: row.response,
    responseCode: row.response_code as number | null,
    responseBody: row.response_body as Buffer | null,
    responseHeaders: row.response_headers as Record<string, string | string[]> | null,
    retryAfterMs,
    retryAfterSeconds:
      (row.retry_after_s as number | null) ??
      (retryAfterMs === null ? null : Math.max(1, Math.ceil(retryAfterMs / 1000))),
    expiresAt: row.expires_at as Date | null,
  };
}
