export * from './errors';
export * from './store';
export * from './run';
export {
  BodyTooLargeError,
  DEFAULT_MAX_BODY_BYTES,
  HttpIdempotency,
  RawBodyUnavailableError,
  decodeStored,
  defaultOutcomeForStatus,
  problem,
  type Decision,
  type HttpIdempotencyOptions,
  type HttpResponse,
  type IdempotencyContext,
  type ProblemCode,
  type RequestInput,
  type Session,
  type StatusOutcome,
  type ValidationAnswer,
} from './http';
export {
  headerValue,
  httpFingerprint,
  httpScope,
  isClaimedMethod,
  parseKeyHeader,
  type FingerprintInput,
  type KeyHeader,
  type ScopeInput,
} from './request';
