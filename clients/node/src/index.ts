export * from './errors';
export * from './store';
export * from './run';
export {
  HttpIdempotency,
  checkKey,
  decodeStored,
  defaultOutcomeForStatus,
  type Decision,
  type HttpIdempotencyOptions,
  type HttpResponse,
  type IdempotencyContext,
  type RequestInput,
  type Session,
  type StatusOutcome,
} from './http';
