import { createHash } from 'node:crypto';
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http';
import type { PoolClient } from 'pg';
import { IdempotencyError, StaleAttemptError, TransientError, isSerializationFailure, translateError } from './errors';
import { resolveHeartbeat, startHeartbeat, type Heartbeat, type IsolationLevel } from './run';
import type { ClaimOptions, ClaimResult, Duration, FinishOptions, IdempotencyStore } from './store';

/** A complete HTTP response, as captured from the handler or replayed from the database. */
export interface HttpResponse {
  status: number;
  headers: Record<string, string | string[]>;
  body: Buffer;
}

/**
 * What a finished response becomes: `succeeded` and `failed` are stored and replayed (failed as a
 * terminal failure); `retry` is a retryable failure (same-transaction mode rolls back, lease mode
 * records a retryable idem_fail): the client's retry runs the handler again.
 */
export type StatusOutcome = 'succeeded' | 'failed' | 'retry';

/** 5xx, 408, 425 and 429 are worth retrying; other 4xx are the request's fault; the rest succeeded. */
export function defaultOutcomeForStatus(status: number): StatusOutcome {
  if (status >= 500 || status === 408 || status === 425 || status === 429) return 'retry';
  if (status >= 400) return 'failed';
  return 'succeeded';
}

export interface HttpIdempotencyOptions {
  /** `transaction` (default): the handler writes through the claim's transaction; `lease`: autocommit claim. */
  mode?: 'transaction' | 'lease';
  /** Answer 400 when the header is missing (default false: such requests pass through untouched). */
  required?: boolean;
  /** Default `idempotency-key`. */
  headerName?: string;
  /** Default 255, as the extension's idempotency.max_key_length. */
  maxKeyLength?: number;
  /** Request headers that are part of the fingerprint (lower case). */
  fingerprintHeaders?: string[];
  /** Response headers stored and replayed with the body (default content-type and location). */
  replayHeaders?: string[];
  ttl?: Duration;
  /** Lease mode: how long the key stays ours without a heartbeat (default 60 s). */
  lease?: Duration;
  /** Lease mode, 1.2: milliseconds between heartbeats, or false (default a third of the lease on 1.2). */
  heartbeatMs?: number | false;
  /** 1.2: wait this long for an in-flight duplicate before answering 409. */
  wait?: Duration;
  isolationLevel?: IsolationLevel;
  /** Claims rolled back by 40001 / 40P01 are tried again this many times (default 3), then 503. */
  maxRetries?: number;
  outcomeForStatus?: (status: number) => StatusOutcome;
  /** Told about database errors that were answered with 5xx (for your logger). */
  onError?: (error: unknown) => void;
}

/** What the handler gets, on `req.idempotency` (Express) or `request.idempotency` (Fastify). */
export interface IdempotencyContext {
  key: string;
  scope: string;
  attempt: number;
  /** Same-transaction mode: the client of the claim's transaction; write through it. */
  client: PoolClient | undefined;
  /** Lease mode: aborted when the key was taken over (stop; the result will not be stored). */
  signal: AbortSignal;
}

export interface RequestInput {
  method: string;
  /** The route pattern (`/orders/:id`), not the URL, so that one endpoint is one scope. */
  route: string;
  tenant?: string;
  headers: IncomingHttpHeaders;
  /** node's raw header list: Node joins a repeated header into one value, this shows the repeat. */
  rawHeaders: string[];
  /** The parsed body (JSON value), a string or a Buffer, or undefined. */
  body: unknown;
}

export type Decision =
  | { kind: 'pass' }
  | { kind: 'respond'; response: HttpResponse }
  | { kind: 'run'; session: Session };

export interface Session {
  context: IdempotencyContext;
  /** Store the handler's response; returns what to send (the response itself, or an error). */
  finish(response: HttpResponse): Promise<HttpResponse>;
  /** The exchange ended without a response (client went away): give the key back. */
  abandon(): Promise<void>;
}

const ENVELOPE = 'idempotency_http';

/**
 * The HTTP rules shared by the Express and Fastify adapters: key checks, scope, fingerprint,
 * claim, replay, and the mapping of outcomes and errors to status codes.
 */
export class HttpIdempotency {
  readonly store: IdempotencyStore;
  private readonly options: HttpIdempotencyOptions;

  constructor(store: IdempotencyStore, options: HttpIdempotencyOptions = {}) {
    this.store = store;
    this.options = options;
  }

  async begin(input: RequestInput): Promise<Decision> {
    const o = this.options;
    const headerName = o.headerName ?? 'idempotency-key';
    const raw = input.headers[headerName];
    if (raw === undefined) {
      return o.required ? respond(problem(400, 'the Idempotency-Key header is required')) : { kind: 'pass' };
    }
    const key = Array.isArray(raw) || isRepeated(input.rawHeaders, headerName) ? undefined : raw;
    const keyProblem = checkKey(key, o.maxKeyLength ?? 255);
    if (keyProblem) return respond(problem(400, keyProblem));
    let request: unknown;
    try {
      request = requestDocument(input, o.fingerprintHeaders ?? []);
    } catch (err) {
      if (err instanceof BadBody) return respond(problem(400, err.message));
      throw err;
    }
    const scope = input.tenant === undefined ? `${input.method} ${input.route}` : `${input.tenant}:${input.method} ${input.route}`;
    const claimOptions: ClaimOptions = { key: key as string, scope, request, ttl: o.ttl, wait: o.wait };
    try {
      return o.mode === 'lease' ? await this.beginLease(claimOptions) : await this.beginTransaction(claimOptions);
    } catch (err) {
      return respond(this.errorResponse(err));
    }
  }

  private async beginTransaction(claimOptions: ClaimOptions): Promise<Decision> {
    const maxRetries = this.options.maxRetries ?? 3;
    for (let retry = 0; ; retry++) {
      const client = await this.store.pool.connect();
      let claim: ClaimResult;
      try {
        claim = await this.store.beginAndClaim(client, claimOptions, this.options.isolationLevel);
      } catch (err) {
        await endTransaction(client, 'ROLLBACK');
        if (isSerializationFailure(err) && retry < maxRetries) continue;
        throw err;
      }
      if (claim.outcome !== 'claimed') {
        // the answer does not depend on the rollback: send it without waiting for it
        void endTransaction(client, 'ROLLBACK');
        return respond(this.answerFor(claim));
      }
      return { kind: 'run', session: this.transactionSession(client, claimOptions, claim.attempt as number) };
    }
  }

  private transactionSession(client: PoolClient, claimOptions: ClaimOptions, attempt: number): Session {
    let open = true;
    const close = async (command: 'COMMIT' | 'ROLLBACK') => {
      open = false;
      await endTransaction(client, command);
    };
    return {
      context: { key: claimOptions.key, scope: claimOptions.scope ?? '', attempt, client, signal: new AbortController().signal },
      finish: async (response) => {
        if (!open) throw new Error('the idempotent exchange is already finished');
        const outcome = (this.options.outcomeForStatus ?? defaultOutcomeForStatus)(response.status);
        if (outcome === 'retry') {
          await close('ROLLBACK');
          return response;
        }
        try {
          await this.store.record(client, outcome === 'succeeded' ? 'complete' : 'fail', {
            ...(await this.stored(claimOptions, response)),
            attempt,
            retryable: false,
          });
          await client.query('COMMIT');
          open = false;
          client.release();
          return response;
        } catch (err) {
          if (open) await close('ROLLBACK');
          return this.errorResponse(translateError(err));
        }
      },
      abandon: async () => {
        if (open) await close('ROLLBACK');
      },
    };
  }

  private async beginLease(claimOptions: ClaimOptions): Promise<Decision> {
    const lease = this.options.lease ?? 60_000;
    const heartbeatMs = await resolveHeartbeat(this.store, { lease, heartbeatMs: this.options.heartbeatMs });
    const maxRetries = this.options.maxRetries ?? 3;
    let claim: ClaimResult;
    for (let retry = 0; ; retry++) {
      try {
        claim = await this.store.claim(this.store.pool, { ...claimOptions, lease });
        break;
      } catch (err) {
        if (!isSerializationFailure(err) || retry >= maxRetries) throw err;
      }
    }
    if (claim.outcome !== 'claimed') return respond(this.answerFor(claim));
    const attempt = claim.attempt as number;
    const heartbeat: Heartbeat = startHeartbeat(this.store, { key: claimOptions.key, scope: claimOptions.scope, lease }, attempt, heartbeatMs);
    let open = true;
    const base = { key: claimOptions.key, scope: claimOptions.scope, attempt };
    return {
      kind: 'run',
      session: {
        context: { key: claimOptions.key, scope: claimOptions.scope ?? '', attempt, client: undefined, signal: heartbeat.signal },
        finish: async (response) => {
          if (!open) throw new Error('the idempotent exchange is already finished');
          open = false;
          heartbeat.stop();
          const outcome = (this.options.outcomeForStatus ?? defaultOutcomeForStatus)(response.status);
          try {
            const stored = { ...(await this.stored(claimOptions, response)), attempt };
            if (outcome === 'succeeded') await this.store.record(this.store.pool, 'complete', stored);
            else await this.store.record(this.store.pool, 'fail', { ...stored, retryable: outcome === 'retry' });
            return response;
          } catch (err) {
            return this.errorResponse(err);
          }
        },
        abandon: async () => {
          if (!open) return;
          open = false;
          heartbeat.stop();
          await this.store.record(this.store.pool, 'fail', { ...base, retryable: true }).catch((err) => this.options.onError?.(err));
        },
      },
    };
  }

  /** The replayed response, or 409 for a key in progress. */
  private answerFor(claim: ClaimResult): HttpResponse {
    if (claim.outcome === 'in_progress') {
      const response = problem(409, 'a request with this Idempotency-Key is in progress');
      response.headers['retry-after'] = String(claim.retryAfterSeconds ?? 1);
      return response;
    }
    const replay = decodeStored(claim);
    replay.headers['idempotent-replayed'] = 'true';
    return replay;
  }

  /** complete/fail arguments that let the response come back byte for byte. */
  private async stored(claimOptions: ClaimOptions, response: HttpResponse): Promise<FinishOptions> {
    const headers: Record<string, string | string[]> = {};
    for (const name of this.options.replayHeaders ?? ['content-type', 'location']) {
      const value = response.headers[name];
      if (value !== undefined) headers[name] = Array.isArray(value) ? value.map(String) : String(value);
    }
    const base = { key: claimOptions.key, scope: claimOptions.scope, responseCode: response.status };
    if (await this.store.supportsV12()) return { ...base, body: response.body, headers };
    // 1.1 has only jsonb: keep the bytes as a JSON string (exact for UTF-8 text) or as base64
    const text = response.body.toString('utf8');
    const exactText = !text.includes('\u0000') && Buffer.byteLength(text) === response.body.length && text.isWellFormed();
    return {
      ...base,
      response: exactText
        ? { [ENVELOPE]: 1, headers, body: text }
        : { [ENVELOPE]: 1, headers, body_base64: response.body.toString('base64') },
    };
  }

  private errorResponse(err: unknown): HttpResponse {
    if (err instanceof StaleAttemptError) {
      const response = problem(409, 'this attempt was taken over by a newer one; retry to get its result');
      response.headers['retry-after'] = '1';
      return response;
    }
    if (err instanceof TransientError) {
      this.options.onError?.(err);
      const response = problem(503, 'the database asked to try again');
      response.headers['retry-after'] = '1';
      return response;
    }
    if (err instanceof IdempotencyError && err.httpStatus < 500) {
      return problem(err.httpStatus, err.sqlstate === 'IK001'
        ? 'this Idempotency-Key was already used with a different request'
        : err.message);
    }
    this.options.onError?.(err);
    return problem(err instanceof IdempotencyError ? err.httpStatus : 500, 'internal error');
  }
}

function respond(response: HttpResponse): Decision {
  return { kind: 'respond', response };
}

function problem(status: number, title: string): HttpResponse {
  return {
    status,
    headers: { 'content-type': 'application/problem+json' },
    body: Buffer.from(JSON.stringify({ title, status })),
  };
}

/** The IETF header's rules, as the extension checks them: 1..max printable ASCII characters. */
export function checkKey(key: string | undefined, maxLength: number): string | undefined {
  if (key === undefined) return 'the Idempotency-Key header must be given once';
  if (key.length < 1 || key.length > maxLength) return `the Idempotency-Key header must be 1 to ${maxLength} characters long`;
  if (!/^[\x20-\x7e]+$/.test(key)) return 'the Idempotency-Key header must contain only printable ASCII characters';
  return undefined;
}

/** Is the header given more than once? (Node joins a repeated header into one value.) */
function isRepeated(rawHeaders: string[], lowerCaseName: string): boolean {
  let seen = 0;
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i];
    if (name.length === lowerCaseName.length && name.toLowerCase() === lowerCaseName && ++seen > 1) return true;
  }
  return false;
}

class BadBody extends Error {}

/** The jsonb the server fingerprints: the body and the chosen headers. */
function requestDocument(input: RequestInput, fingerprintHeaders: string[]): unknown {
  const doc: Record<string, unknown> = {};
  const body = input.body;
  if (Buffer.isBuffer(body) || typeof body === 'string') {
    doc.body_sha256 = createHash('sha256').update(body).digest('hex');
  } else if (body !== undefined) {
    assertStorableJson(body);
    doc.body = body;
  }
  if (fingerprintHeaders.length > 0) {
    const headers: Record<string, string | null> = {};
    for (const name of fingerprintHeaders) {
      const value = input.headers[name.toLowerCase()];
      headers[name.toLowerCase()] = value === undefined ? null : String(value);
    }
    assertStorableJson(headers);
    doc.headers = headers;
  }
  return doc;
}

/**
 * jsonb refuses \u0000 (22P05) and unpaired surrogates (22P02), and its error's CONTEXT would quote
 * the body into the server log: refuse them here, before the database sees them.
 */
function assertStorableJson(value: unknown): void {
  if (typeof value === 'string') {
    if (value.includes('\u0000')) throw new BadBody('the request body must not contain \\u0000');
    if (!value.isWellFormed()) throw new BadBody('the request body must not contain unpaired surrogates');
  } else if (Array.isArray(value)) {
    for (const item of value) assertStorableJson(item);
  } else if (value !== null && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) {
      assertStorableJson(k);
      assertStorableJson(v);
    }
  }
}

/** The stored response as HTTP: 1.2's body and headers columns, or 1.1's envelope in `response`. */
export function decodeStored(claim: ClaimResult): HttpResponse {
  const status = claim.responseCode ?? 200;
  if (claim.responseBody !== null || claim.responseHeaders !== null) {
    return { status, headers: { ...(claim.responseHeaders ?? {}) }, body: claim.responseBody ?? Buffer.alloc(0) };
  }
  const stored = claim.response as Record<string, unknown> | null;
  if (stored !== null && typeof stored === 'object' && stored[ENVELOPE] === 1) {
    const body = typeof stored.body === 'string'
      ? Buffer.from(stored.body, 'utf8')
      : Buffer.from(String(stored.body_base64 ?? ''), 'base64');
    return { status, headers: { ...(stored.headers as Record<string, string | string[]>) }, body };
  }
  // a key finished by other code (SQL, the core API): its jsonb response as JSON
  return stored === null || stored === undefined
    ? { status, headers: {}, body: Buffer.alloc(0) }
    : { status, headers: { 'content-type': 'application/json' }, body: Buffer.from(JSON.stringify(stored)) };
}

/** Headers for writeHead from captured ones (drops nothing; numbers become strings). */
export function toHeaderRecord(headers: OutgoingHttpHeaders | Record<string, string | number | string[] | undefined>): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value !== undefined) out[name] = Array.isArray(value) ? value.map(String) : String(value);
  }
  return out;
}

async function endTransaction(client: PoolClient, command: 'COMMIT' | 'ROLLBACK'): Promise<void> {
  try {
    await client.query(command);
    client.release();
  } catch (err) {
    client.release(err as Error); // a connection in an unknown state is not given back to the pool
  }
}
