import { STATUS_CODES, type OutgoingHttpHeaders } from 'node:http';
import type { PoolClient } from 'pg';
import {
  IdempotencyError,
  PartitionUnavailableError,
  RowSecurityNotInForceError,
  StaleAttemptError,
  TransientError,
  isSerializationFailure,
  translateError,
} from './errors';
import { contentLength, httpFingerprint, httpScope, isClaimedMethod, parseKeyHeader, type KeyHeader } from './request';
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

/** docs/http.md, "What is stored": 5xx, 408, 425 and 429 are retryable; other 4xx final; the rest succeeded. */
export function defaultOutcomeForStatus(status: number): StatusOutcome {
  if (status >= 500 || status === 408 || status === 425 || status === 429) return 'retry';
  if (status >= 400) return 'failed';
  return 'succeeded';
}

/** An answer a `validate` hook gives instead of running the route: a JSON body unless bytes or text. */
export interface ValidationAnswer {
  status: number;
  headers?: Record<string, string | string[]>;
  body?: unknown;
}

export interface HttpIdempotencyOptions<Req = unknown> {
  /**
   * Who sent the request: the authenticated principal's stable id (`(req) => req.user.id`). Every
   * key is stored under its caller, so that one caller never gets another's answer. A keyed request
   * for which it returns nothing (null, undefined or "") is answered 401. Give this or `public`.
   */
  caller?: (request: Req) => string | null | undefined;
  /**
   * true: the route has no callers to tell apart (a webhook keyed by the sender's own event id);
   * any client that sends a key gets the answer stored for it. Give this or `caller`.
   */
  public?: boolean;
  /** The largest body of a keyed request the library reads, in bytes (default 102400); larger: 413. */
  maxBodyBytes?: number;
  /** Claim GET, HEAD, OPTIONS and TRACE requests too (default false: they pass through untouched). */
  claimSafeMethods?: boolean;
  /** `transaction` (default): the handler writes through the claim's transaction; `lease`: autocommit claim. */
  mode?: 'transaction' | 'lease';
  /** Answer 400 when the header is missing (default false: such requests pass through untouched). */
  required?: boolean;
  /** Default `Idempotency-Key`. */
  headerName?: string;
  /** Default 255, as the extension's idempotency.max_key_length. */
  maxKeyLength?: number;
  /** Request headers that are part of the fingerprint. */
  fingerprintHeaders?: string[];
  /** Response headers stored and replayed with the body (default content-type, location, cache-control). */
  replayHeaders?: string[];
  ttl?: Duration;
  /** Lease mode: how long the key stays ours without a heartbeat (default 60 s). */
  lease?: Duration;
  /** Lease mode, 1.2 or later: milliseconds between heartbeats, or false (default a third of the lease). */
  heartbeatMs?: number | false;
  /** 1.2 or later: wait this long for an in-flight duplicate before answering 409. */
  wait?: Duration;
  isolationLevel?: IsolationLevel;
  /** Claims rolled back by 40001 / 40P01 are tried again this many times (default 3), then 503. */
  maxRetries?: number;
  outcomeForStatus?: (status: number) => StatusOutcome;
  /**
   * Same-transaction mode: keep the handler's writes when its answer is a stored failure (4xx).
   * Default false: they are rolled back to the savepoint taken after the claim.
   */
  keepWritesOnError?: boolean;
  /** Runs before the key is claimed; an answer it gives is sent and nothing is stored for the key. */
  validate?: (request: Req) => ValidationAnswer | undefined | Promise<ValidationAnswer | undefined>;
  /** Runs once the response is stored (and committed), before it is sent; its failure goes to onError. */
  onCommitted?: (request: Req, response: HttpResponse) => void | Promise<void>;
  /** Told about errors that were answered with 5xx, and about a failed onCommitted (for your logger). */
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

export interface RequestInput<Req = unknown> {
  /** The framework's request, handed to the hooks. */
  request: Req;
  method: string;
  /** The request target as received: path and query, not decoded. */
  target: string;
  /** The route pattern (`/orders/:id`), not the URL, so that one endpoint is one scope. */
  route: string;
  tenant?: string;
  /** node's raw header list: it shows a repeated header that Node would join or drop. */
  rawHeaders: string[];
  /**
   * The body's exact bytes, read once the key is known to be needed; rejects with
   * BodyTooLargeError, having kept no more than `maxBytes`, when the body is larger.
   */
  readBody: (maxBytes: number) => Promise<Buffer>;
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

/** The machine-readable `code` of each problem answer (docs/http.md, "Errors"). */
export type ProblemCode =
  | 'idempotency_key_missing'
  | 'idempotency_key_invalid'
  | 'idempotency_caller_unknown'
  | 'idempotency_body_too_large'
  | 'idempotency_key_in_progress'
  | 'idempotency_key_mismatch'
  | 'idempotency_unavailable'
  | 'idempotency_attempt_stale'
  | 'idempotency_raw_body_unavailable'
  | 'idempotency_internal_error';

/** The raw body cannot be known (a parser consumed it without keeping it): a setup error, answered 500. */
export class RawBodyUnavailableError extends Error {}

/** The body is over the route's limit (`maxBodyBytes`): answered 413. */
export class BodyTooLargeError extends Error {}

/** docs/http.md, "Body size": Express's own default, the smallest of the frameworks'. */
export const DEFAULT_MAX_BODY_BYTES = 102_400;
const DEFAULT_REPLAY_HEADERS = ['content-type', 'location', 'cache-control'];

const CALLER_HINT =
  'caller: (req) => req.user.id (the authenticated principal), or public: true for a route without callers ' +
  '(e.g. a webhook keyed by the sender\'s own event id); see docs/http.md "Keys belong to a caller"';

/**
 * Refuses, when the route is mounted, options that do not say who the caller is (or say it twice),
 * and a body limit that is not a byte count.
 */
export function checkOptions(options: HttpIdempotencyOptions<never>): void {
  const hasCaller = options.caller !== undefined;
  const isPublic = options.public === true;
  if (!hasCaller && !isPublic) throw new TypeError(`pg-idempotency: say who the caller is: ${CALLER_HINT}`);
  if (hasCaller && isPublic) throw new TypeError(`pg-idempotency: give either caller or public: true, not both: ${CALLER_HINT}`);
  if (hasCaller && typeof options.caller !== 'function') throw new TypeError(`pg-idempotency: caller must be a function: ${CALLER_HINT}`);
  const max = options.maxBodyBytes;
  if (max !== undefined && !(Number.isSafeInteger(max) && max >= 0)) {
    throw new TypeError('pg-idempotency: maxBodyBytes must be a whole number of bytes (0 or more)');
  }
}

const ENVELOPE = 'idempotency_http';
const SAVEPOINT = 'idempotency_handler';

/**
 * The HTTP rules shared by the Express and Fastify adapters: key checks, scope, fingerprint,
 * claim, replay, and the mapping of outcomes and errors to status codes (docs/http.md).
 */
export class HttpIdempotency<Req = unknown> {
  readonly store: IdempotencyStore;
  private readonly options: HttpIdempotencyOptions<Req>;

  /** Throws a TypeError when the options do not say who the caller is (see checkOptions). */
  constructor(store: IdempotencyStore, options: HttpIdempotencyOptions<Req>) {
    checkOptions(options as HttpIdempotencyOptions<never>);
    this.store = store;
    this.options = options;
  }

  get maxBodyBytes(): number {
    return this.options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  }

  private keyHeader(rawHeaders: readonly string[]): KeyHeader {
    return parseKeyHeader(rawHeaders, this.options.headerName ?? 'Idempotency-Key', this.options.maxKeyLength ?? 255);
  }

  /**
   * Whether the library will read this request's body: a claimed method with a well-formed key.
   * Everything else is left to the handler and its parsers (docs/http.md, "Body size").
   */
  readsBody(method: string, rawHeaders: readonly string[]): boolean {
    return isClaimedMethod(method, this.options.claimSafeMethods) && this.keyHeader(rawHeaders).kind === 'key';
  }

  /** The 413 answer for a body over the limit. */
  bodyTooLarge(): HttpResponse {
    return problem(413, 'idempotency_body_too_large', `the request body is larger than this route's limit of ${this.maxBodyBytes} bytes`);
  }

  async begin(input: RequestInput<Req>): Promise<Decision> {
    const o = this.options;
    // safe methods pass through as if the library were absent (docs/http.md, "Methods")
    if (!isClaimedMethod(input.method, o.claimSafeMethods)) return { kind: 'pass' };
    const headerName = o.headerName ?? 'Idempotency-Key';
    const header = this.keyHeader(input.rawHeaders);
    if (header.kind === 'invalid') return respond(problem(400, 'idempotency_key_invalid', header.detail));
    if (header.kind === 'missing' && o.required) {
      return respond(problem(400, 'idempotency_key_missing', `this route requires the ${headerName} header`));
    }
    let caller: string | undefined;
    if (header.kind === 'key') {
      if (o.caller !== undefined) {
        const id = o.caller(input.request);
        if (id !== undefined && id !== null && typeof id !== 'string') {
          throw new TypeError(`pg-idempotency: the caller hook must return a string id (or null), not a ${typeof id}`);
        }
        // no caller, no key: another caller's stored answer must never be reachable
        if (!id) return respond(problem(401, 'idempotency_caller_unknown', 'this route keeps keys per caller, and the request has none (not authenticated)'));
        caller = id;
      }
      const length = contentLength(input.rawHeaders);
      if (length !== undefined && length > this.maxBodyBytes) return respond(this.bodyTooLarge());
    }
    if (o.validate) {
      const answer = await o.validate(input.request);
      if (answer !== undefined) return respond(validationResponse(answer));
    }
    if (header.kind === 'missing') return { kind: 'pass' };
    let body: Buffer;
    try {
      body = await input.readBody(this.maxBodyBytes);
    } catch (err) {
      if (err instanceof BodyTooLargeError) return respond(this.bodyTooLarge());
      if (!(err instanceof RawBodyUnavailableError)) throw err;
      o.onError?.(err);
      return respond(problem(500, 'idempotency_raw_body_unavailable', err.message));
    }
    const fingerprint = httpFingerprint({
      method: input.method,
      target: input.target,
      rawHeaders: input.rawHeaders,
      fingerprintHeaders: o.fingerprintHeaders,
      body,
    });
    const scope = httpScope({ method: input.method, route: input.route, tenant: input.tenant, caller });
    const claimOptions: ClaimOptions = { key: header.key, scope, fingerprint, ttl: o.ttl, wait: o.wait };
    try {
      return o.mode === 'lease'
        ? await this.beginLease(input.request, claimOptions)
        : await this.beginTransaction(input.request, claimOptions);
    } catch (err) {
      return respond(this.errorResponse(err));
    }
  }

  private async beginTransaction(request: Req, claimOptions: ClaimOptions): Promise<Decision> {
    const maxRetries = this.options.maxRetries ?? 3;
    for (let retry = 0; ; retry++) {
      const client = await this.store.pool.connect();
      let claim: ClaimResult;
      try {
        claim = await this.store.beginAndClaim(client, claimOptions, this.options.isolationLevel, SAVEPOINT);
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
      return { kind: 'run', session: this.transactionSession(request, client, claimOptions, claim.attempt as number) };
    }
  }

  private transactionSession(request: Req, client: PoolClient, claimOptions: ClaimOptions, attempt: number): Session {
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
          // an error answer does not leave half the handler's work committed
          if (outcome === 'failed' && !this.options.keepWritesOnError) await client.query(`ROLLBACK TO SAVEPOINT ${SAVEPOINT}`);
          await this.store.record(client, outcome === 'succeeded' ? 'complete' : 'fail', {
            ...(await this.stored(claimOptions, response)),
            attempt,
            retryable: false,
          });
          await client.query('COMMIT');
          open = false;
          client.release();
        } catch (err) {
          if (open) await close('ROLLBACK');
          return this.errorResponse(translateError(err));
        }
        await this.committed(request, response);
        return response;
      },
      abandon: async () => {
        if (open) await close('ROLLBACK');
      },
    };
  }

  private async beginLease(request: Req, claimOptions: ClaimOptions): Promise<Decision> {
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
          // a heartbeat found the key taken over: this attempt's result is not ours to store
          if (heartbeat.signal.aborted) return this.errorResponse(new StaleAttemptError('the key was taken over', 409));
          const outcome = (this.options.outcomeForStatus ?? defaultOutcomeForStatus)(response.status);
          try {
            const stored = { ...(await this.stored(claimOptions, response)), attempt };
            if (outcome === 'succeeded') await this.store.record(this.store.pool, 'complete', stored);
            else await this.store.record(this.store.pool, 'fail', { ...stored, retryable: outcome === 'retry' });
          } catch (err) {
            return this.errorResponse(err);
          }
          if (outcome !== 'retry') await this.committed(request, response);
          return response;
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

  private async committed(request: Req, response: HttpResponse): Promise<void> {
    if (!this.options.onCommitted) return;
    try {
      await this.options.onCommitted(request, response);
    } catch (err) {
      this.options.onError?.(err);
    }
  }

  /** The replayed response, or 409 for a key in progress. */
  private answerFor(claim: ClaimResult): HttpResponse {
    if (claim.outcome === 'in_progress') {
      const response = problem(409, 'idempotency_key_in_progress', 'a request with this key is still being processed; retry later');
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
    for (const name of this.options.replayHeaders ?? DEFAULT_REPLAY_HEADERS) {
      const value = response.headers[name.toLowerCase()];
      if (value !== undefined) headers[name.toLowerCase()] = Array.isArray(value) ? value.map(String) : String(value);
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
      const response = problem(409, 'idempotency_attempt_stale', 'the key was taken over by a newer attempt while this one ran; its result was not stored');
      response.headers['retry-after'] = '1';
      return response;
    }
    if (err instanceof IdempotencyError && err.sqlstate === 'IK001') {
      return problem(422, 'idempotency_key_mismatch', 'this key was already used for a different request');
    }
    this.options.onError?.(err);
    if (err instanceof TransientError || err instanceof RowSecurityNotInForceError || isConnectionError(err)) {
      const response = problem(503, 'idempotency_unavailable', 'the idempotency store is unavailable; retry later');
      // a partition that is down, or tenant policies an operator must restore, take longer than a lost race
      response.headers['retry-after'] = err instanceof PartitionUnavailableError || err instanceof RowSecurityNotInForceError ? '5' : '1';
      return response;
    }
    return problem(500, 'idempotency_internal_error', 'the idempotency store failed');
  }
}

/**
 * The stream's bytes, or BodyTooLargeError as soon as they pass maxBytes: what was read is
 * dropped and the rest is discarded as it arrives (not kept), so that the client, still sending,
 * reads the 413 instead of a reset connection.
 */
export function readLimited(stream: NodeJS.ReadableStream, maxBytes: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    let chunks: Buffer[] = [];
    let size = 0;
    const cleanup = () => {
      stream.removeListener('data', onData);
      stream.removeListener('end', onEnd);
      stream.removeListener('error', onError);
    };
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size <= maxBytes) {
        chunks.push(chunk);
        return;
      }
      chunks = [];
      cleanup();
      stream.on('error', () => undefined); // a client that gives up on the rest is no error of ours
      stream.resume();
      reject(new BodyTooLargeError());
    };
    const onEnd = () => {
      cleanup();
      resolve(Buffer.concat(chunks, size));
    };
    const onError = (err: Error) => {
      cleanup();
      reject(err);
    };
    stream.on('data', onData);
    stream.on('end', onEnd);
    stream.on('error', onError);
  });
}

/** No answer from the database (refused, reset, timed out): the client may retry later. */
function isConnectionError(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code === 'string' && (/^(ECONN|ETIMEDOUT|ENOTFOUND|EPIPE|EAI_)/.test(code) || code.startsWith('08') || code === '57P01' || code === '57P03')) return true;
  return err instanceof Error && /Connection terminated|timeout exceeded when trying to connect/.test(err.message);
}

function respond(response: HttpResponse): Decision {
  return { kind: 'respond', response };
}

/** An RFC 9457 problem details answer; `detail` never quotes the request. */
export function problem(status: number, code: ProblemCode, detail: string): HttpResponse {
  return {
    status,
    headers: { 'content-type': 'application/problem+json' },
    body: Buffer.from(JSON.stringify({ type: 'about:blank', title: STATUS_CODES[status] ?? 'Error', status, detail, code })),
  };
}

function validationResponse(answer: ValidationAnswer): HttpResponse {
  const headers: Record<string, string | string[]> = {};
  for (const [name, value] of Object.entries(answer.headers ?? {})) headers[name.toLowerCase()] = value;
  let body: Buffer;
  if (answer.body === undefined) body = Buffer.alloc(0);
  else if (Buffer.isBuffer(answer.body)) body = answer.body;
  else if (typeof answer.body === 'string') body = Buffer.from(answer.body);
  else {
    body = Buffer.from(JSON.stringify(answer.body));
    headers['content-type'] ??= 'application/json';
  }
  return { status: answer.status, headers, body };
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
