/** Typed errors for every SQLSTATE the extension (or PostgreSQL on its calls) can raise. */

export interface DatabaseErrorLike {
  code?: string;
  message: string;
  detail?: string;
  hint?: string;
  column?: string;
}

/** Base class: `sqlstate` is the server's code when the error came from PostgreSQL. */
export class IdempotencyError extends Error {
  /** The HTTP status an API should answer with. */
  readonly httpStatus: number;
  readonly sqlstate: string | undefined;
  readonly detail: string | undefined;
  readonly hint: string | undefined;
  /**
   * The key of a batch call (idem_claim_batch, idem_complete_batch) that the error is about: the
   * one that failed with IK001 to IK004 or 22003, or a repeated one. The server sends it in the
   * error's column field (node-postgres' `err.column`); undefined for other errors.
   */
  readonly key: string | undefined;

  constructor(message: string, httpStatus: number, source?: DatabaseErrorLike) {
    super(message, source ? { cause: source } : undefined);
    this.name = new.target.name;
    this.httpStatus = httpStatus;
    this.sqlstate = source?.code;
    this.detail = source?.detail;
    this.hint = source?.hint;
    this.key = source?.column;
  }
}

/** IK001: the key was already used with a different request (422). */
export class KeyMismatchError extends IdempotencyError {}
/** IK002: complete/fail/extend with an attempt that was taken over (fenced off). Never a success. */
export class StaleAttemptError extends IdempotencyError {}
/** IK003: the key does not exist (or expired, in 1.2). */
export class KeyNotFoundError extends IdempotencyError {}
/** IK004: the key is already finished. */
export class KeyNotPendingError extends IdempotencyError {}
/** IK005 (1.2): idem_forget of a key with a live lease without force. */
export class KeyInProgressError extends IdempotencyError {}
/** 22004, 22023, 22P02, 22P05: an argument the server refused (400). */
export class InvalidArgumentError extends IdempotencyError {}
/**
 * 40001, 40P01: the transaction lost a race and was rolled back; running it again is safe.
 * 55P03, 57014: a lock or statement timeout; also safe to retry later.
 */
export class TransientError extends IdempotencyError {}
/** 25006: a write on a read-only transaction or a hot standby (503). */
export class ReadOnlyError extends IdempotencyError {}
/**
 * IK006 (extension 1.5): a restore could not put the recorded tenant policies back, and the
 * server refuses the roles they would confine until an operator runs idem_row_security_apply() (503).
 */
export class RowSecurityNotInForceError extends IdempotencyError {}
/** IK900 (scale-out): the scope moved to another partition during the call (a resharding); retry (503). */
export class ScopeMovedError extends TransientError {}
/** IK901 (scale-out): the scope's partition cannot be reached; retry later (503). */
export class PartitionUnavailableError extends TransientError {}
/** The installed extension is older than the feature asked for. */
export class UnsupportedVersionError extends IdempotencyError {
  readonly requiredVersion: string;
  readonly installedVersion: string;
  constructor(feature: string, requiredVersion: string, installedVersion: string) {
    super(
      `${feature} needs idempotency extension version ${requiredVersion}; ` +
        `the database has version ${installedVersion} (ALTER EXTENSION idempotency UPDATE)`,
      500,
    );
    this.requiredVersion = requiredVersion;
    this.installedVersion = installedVersion;
  }
}
/** Lease mode was asked to claim on a connection with an open transaction. */
export class OpenTransactionError extends IdempotencyError {}

const bySqlstate: Record<string, [new (m: string, s: number, e: DatabaseErrorLike) => IdempotencyError, number]> = {
  IK001: [KeyMismatchError, 422],
  IK002: [StaleAttemptError, 409],
  IK003: [KeyNotFoundError, 404],
  IK004: [KeyNotPendingError, 409],
  IK005: [KeyInProgressError, 409],
  '22004': [InvalidArgumentError, 400],
  '22023': [InvalidArgumentError, 400],
  '22P02': [InvalidArgumentError, 400],
  '22P05': [InvalidArgumentError, 400],
  '40001': [TransientError, 503],
  '40P01': [TransientError, 503],
  '55P03': [TransientError, 503],
  '57014': [TransientError, 503],
  '25006': [ReadOnlyError, 503],
  IK006: [RowSecurityNotInForceError, 503],
  IK900: [ScopeMovedError, 503],
  IK901: [PartitionUnavailableError, 503],
};

/** The typed error for a driver error, or the error itself when it is not one of ours. */
export function translateError(err: unknown): unknown {
  if (err instanceof IdempotencyError || !(err instanceof Error)) return err;
  const code = (err as DatabaseErrorLike).code;
  const entry = code === undefined ? undefined : bySqlstate[code];
  if (!entry) return err;
  const [ErrorClass, httpStatus] = entry;
  return new ErrorClass(err.message, httpStatus, err as DatabaseErrorLike);
}

/**
 * 40001 and 40P01, from our calls or from the handler's own queries: the server rolled the
 * transaction back and running it again is safe.
 */
export function isSerializationFailure(err: unknown): boolean {
  const translated = translateError(err);
  return translated instanceof TransientError && (translated.sqlstate === '40001' || translated.sqlstate === '40P01');
}
