export * from './errors';
export * from './store';
export * from './run';
export {
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
export { httpFingerprint, parseKeyHeader, type FingerprintInput, type KeyHeader } from './request';
