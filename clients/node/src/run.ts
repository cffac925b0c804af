import type { PoolClient } from 'pg';
import { StaleAttemptError, UnsupportedVersionError, isSerializationFailure, translateError } from './errors';
import type { ClaimOptions, ClaimResult, Duration, IdempotencyStore } from './store';

/** What a handler produces; it is stored and replayed to every retry. */
export interface HandlerResult {
  response?: unknown;
  responseCode?: number;
  /** 1.2: exact bytes to replay. */
  body?: Buffer | string;
  /** 1.2: headers to replay. */
  headers?: Record<string, string | string[]>;
  /** 1.2: how long to keep this result. */
  ttl?: Duration;
}

/** How a thrown error is recorded: retryable (the next claim runs the work again) or terminal (replayed). */
export interface FailureRecord {
  retryable: boolean;
  response?: unknown;
  responseCode?: number;
}

export type FailurePolicy = (error: unknown) => FailureRecord;

export const retryEveryFailure: FailurePolicy = () => ({ retryable: true });

export type RunResult<T> =
  | { outcome: 'executed'; result: T; attempt: number }
  | { outcome: 'replay'; claim: ClaimResult }
  | { outcome: 'in_progress'; claim: ClaimResult };

export type IsolationLevel = 'READ COMMITTED' | 'REPEATABLE READ' | 'SERIALIZABLE';

export interface TransactionRunOptions extends Omit<ClaimOptions, 'lease'> {
  isolationLevel?: IsolationLevel;
  /** How many times a transaction rolled back by 40001 / 40P01 is run again (default 3). */
  maxRetries?: number;
  onFailure?: FailurePolicy;
}

/**
 * Same-transaction mode: claim, run `handler` with the transaction's client, complete, commit.
 * The business writes and the key commit or vanish together. A thrown error rolls everything
 * back; a terminal failure (by `onFailure`) is then recorded in its own transaction.
 */
export async function runInTransaction<T extends HandlerResult>(
  store: IdempotencyStore,
  options: TransactionRunOptions,
  handler: (client: PoolClient, claim: ClaimResult) => Promise<T>,
): Promise<RunResult<T>> {
  const maxRetries = options.maxRetries ?? 3;
  for (let retry = 0; ; retry++) {
    try {
      return await runTransactionOnce(store, options, handler);
    } catch (err) {
      // database errors, the handler's own included, come out typed
      if (!isSerializationFailure(err) || retry >= maxRetries) throw translateError(err);
    }
  }
}

async function runTransactionOnce<T extends HandlerResult>(
  store: IdempotencyStore,
  options: TransactionRunOptions,
  handler: (client: PoolClient, claim: ClaimResult) => Promise<T>,
): Promise<RunResult<T>> {
  const client = await store.pool.connect();
  let broken: Error | undefined;
  try {
    let claim: ClaimResult;
    try {
      claim = await store.beginAndClaim(client, options, options.isolationLevel);
    } catch (err) {
      await client.query('ROLLBACK');
      throw err;
    }
    if (claim.outcome !== 'claimed') {
      await client.query('ROLLBACK');
      return { outcome: claim.outcome, claim };
    }
    let result: T;
    try {
      result = await handler(client, claim);
      await store.record(client, 'complete', { ...options, ...result, attempt: claim.attempt ?? undefined });
      await client.query('COMMIT');
    } catch (err) {
      await client.query('ROLLBACK').catch((rollbackError: Error) => {
        broken = rollbackError;
      });
      if (!isSerializationFailure(err)) await recordTerminalFailure(store, options, err);
      throw err;
    }
    return { outcome: 'executed', result, attempt: claim.attempt as number };
  } finally {
    client.release(broken);
  }
}

async function recordTerminalFailure(store: IdempotencyStore, options: TransactionRunOptions, err: unknown) {
  const record = (options.onFailure ?? retryEveryFailure)(err);
  if (record.retryable) return; // the rollback removed the key: the next claim starts afresh
  const claim = await store.claim(store.pool, options);
  if (claim.outcome !== 'claimed') return; // someone else owns or finished it meanwhile
  await store.record(store.pool, 'fail', {
    key: options.key,
    scope: options.scope,
    attempt: claim.attempt ?? undefined,
    retryable: false,
    response: record.response,
    responseCode: record.responseCode,
  });
}

export interface LeaseRunOptions extends ClaimOptions {
  lease: Duration;
  /**
   * Milliseconds between heartbeats (idem_extend, 1.2), or false for none. Default: a third of the
   * lease when the database has 1.2, none on 1.1. A number on 1.1 raises UnsupportedVersionError.
   */
  heartbeatMs?: number | false;
  onFailure?: FailurePolicy;
  /** The connection to claim on (default: the store's pool); it must not be in a transaction. */
  client?: PoolClient;
}

export interface LeaseContext {
  attempt: number;
  claim: ClaimResult;
  /** Aborted when a heartbeat learns that the key was taken over: stop and do not report success. */
  signal: AbortSignal;
}

/**
 * Lease mode: claim in autocommit, run `handler` outside any transaction while heartbeats keep
 * the lease, then complete (or fail) fenced by the attempt. A worker that was taken over gets
 * StaleAttemptError, never a success.
 */
export async function runWithLease<T extends HandlerResult>(
  store: IdempotencyStore,
  options: LeaseRunOptions,
  handler: (context: LeaseContext) => Promise<T>,
): Promise<RunResult<T>> {
  const db = options.client ?? store.pool;
  if (options.client) store.assertAutocommit(options.client);
  const heartbeatMs = await resolveHeartbeat(store, options);
  const claim = await store.claim(db, options);
  if (claim.outcome !== 'claimed') return { outcome: claim.outcome, claim };
  const attempt = claim.attempt as number;
  const heartbeat = startHeartbeat(store, options, attempt, heartbeatMs);
  let result: T;
  try {
    result = await handler({ attempt, claim, signal: heartbeat.signal });
  } catch (err) {
    heartbeat.stop();
    const record = (options.onFailure ?? retryEveryFailure)(err);
    await store
      .record(db, 'fail', { key: options.key, scope: options.scope, attempt, ...record })
      .catch((failError) => {
        if (!(failError instanceof StaleAttemptError)) throw failError;
      });
    throw err;
  }
  heartbeat.stop();
  await store.record(db, 'complete', { key: options.key, scope: options.scope, attempt, ...result });
  return { outcome: 'executed', result, attempt };
}

export async function resolveHeartbeat(
  store: IdempotencyStore,
  options: { lease: Duration; heartbeatMs?: number | false },
): Promise<number | undefined> {
  if (options.heartbeatMs === false) return undefined;
  if (options.heartbeatMs !== undefined) {
    if (!(await store.supportsV12())) {
      throw new UnsupportedVersionError('heartbeatMs (idem_extend)', '1.2', await store.version());
    }
    return options.heartbeatMs;
  }
  if (typeof options.lease !== 'number' || !(await store.supportsV12())) return undefined;
  return Math.max(1, Math.floor(options.lease / 3));
}

export interface Heartbeat {
  signal: AbortSignal;
  stop(): void;
}

export function startHeartbeat(
  store: IdempotencyStore,
  options: { key: string; scope?: string; lease: Duration },
  attempt: number,
  intervalMs: number | undefined,
): Heartbeat {
  const controller = new AbortController();
  if (intervalMs === undefined) return { signal: controller.signal, stop: () => undefined };
  let inFlight = false;
  const timer = setInterval(() => {
    if (inFlight) return;
    inFlight = true;
    store
      .extend(store.pool, { key: options.key, scope: options.scope, attempt, lease: options.lease })
      .catch((err) => {
        // taken over or finished by someone else: the work must stop; other errors (a network
        // blip) leave the lease as it is and the next beat tries again
        if (err instanceof StaleAttemptError || (err as { sqlstate?: string }).sqlstate?.startsWith('IK')) {
          clearInterval(timer);
          controller.abort(err);
        }
      })
      .finally(() => {
        inFlight = false;
      });
  }, intervalMs);
  return { signal: controller.signal, stop: () => clearInterval(timer) };
}
