import type { NextFunction, Request, RequestHandler, Response } from 'express';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { BodyTooLargeError, HttpIdempotency, RawBodyUnavailableError, readLimited, toHeaderRecord, type HttpIdempotencyOptions, type HttpResponse, type IdempotencyContext } from './http';
import type { IdempotencyStore } from './store';

declare global {
  // eslint-disable-next-line @typescript-eslint/no-namespace
  namespace Express {
    interface Request {
      /** Set by the idempotency middleware when this request claimed its key. */
      idempotency?: IdempotencyContext;
    }
  }
}

export interface ExpressIdempotencyOptions extends HttpIdempotencyOptions<Request> {
  /** Tenant of the request (e.g. from its authentication): part of the scope. */
  tenant?: (req: Request) => string | undefined;
}

const RAW_BODY = Symbol('idempotency raw body');
type WithRawBody = Request & { [RAW_BODY]?: Buffer };

/**
 * The `verify` option for express.json(), express.text(), express.raw() and
 * express.urlencoded(): keeps the exact bytes they parse, which the fingerprint needs
 * (`express.json({ verify: keepRawBody })`). Bodies no parser reads are read by the middleware.
 */
export function keepRawBody(req: IncomingMessage, _res: ServerResponse, buf: Buffer): void {
  (req as WithRawBody)[RAW_BODY] = buf;
}

/** The body's exact bytes, once the middleware (or keepRawBody) has them. */
export function rawBody(req: Request): Buffer | undefined {
  return (req as WithRawBody)[RAW_BODY];
}

/**
 * Express middleware; mount it on the route, after the authentication and the body parsers
 * (`app.post('/orders', express.json({ verify: keepRawBody }), idempotent(store, { caller: (req) =>
 * req.user.id }), handler)`), so that the scope is the method, the route pattern and the caller.
 * The handler's response is held until the key is stored (and, in same-transaction mode,
 * committed), then sent. Throws a TypeError when the options give neither `caller` nor `public`.
 */
export function idempotent(store: IdempotencyStore, options: ExpressIdempotencyOptions): RequestHandler {
  const http = new HttpIdempotency<Request>(store, options ?? {});
  return (req: Request, res: Response, next: NextFunction) => {
    const route = req.route?.path === undefined ? req.path : `${req.baseUrl}${String(req.route.path)}`;
    http
      .begin({
        request: req,
        method: req.method,
        target: req.originalUrl,
        route,
        tenant: options.tenant?.(req),
        rawHeaders: req.rawHeaders,
        readBody: (maxBytes) => readRawBody(req as WithRawBody, maxBytes),
      })
      .then((decision) => {
        if (decision.kind === 'pass') return next();
        if (decision.kind === 'respond') return send(res, decision.response);
        req.idempotency = decision.session.context;
        capture(res, decision.session.finish);
        next();
      })
      .catch(next);
  };
}

/**
 * The bytes kept by keepRawBody, or the stream read here when no parser read it, up to maxBytes.
 * A stream that a parser consumed without keepRawBody cannot be known: refused, never guessed.
 */
async function readRawBody(req: WithRawBody, maxBytes: number): Promise<Buffer> {
  const kept = req[RAW_BODY];
  if (kept !== undefined) {
    if (kept.length > maxBytes) throw new BodyTooLargeError();
    return kept;
  }
  if (req.readableEnded || req.readableFlowing !== null) {
    if (!hasBody(req)) return Buffer.alloc(0);
    throw new RawBodyUnavailableError(
      'a body parser read the request body without keeping its bytes: give it { verify: keepRawBody }',
    );
  }
  const body = await readLimited(req, maxBytes);
  req[RAW_BODY] = body;
  return body;
}

/** Whether the request announced a body (as body-parsers decide it). */
function hasBody(req: IncomingMessage): boolean {
  if (req.headers['transfer-encoding'] !== undefined) return true;
  const length = req.headers['content-length'];
  return length !== undefined && Number(length) > 0;
}

/** Hold the handler's writeHead/write/end until `finish` has stored the response. */
function capture(res: Response, finish: (r: HttpResponse) => Promise<HttpResponse>) {
  const original = { writeHead: res.writeHead, write: res.write, end: res.end };
  const chunks: Buffer[] = [];
  let ended = false;
  const collect = (chunk: unknown, encoding: unknown) => {
    if (chunk === undefined || chunk === null || typeof chunk === 'function') return;
    chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as string, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8'));
  };
  res.writeHead = function writeHead(this: Response, status: number, ...rest: unknown[]) {
    res.statusCode = status;
    const headers = rest.find((arg) => typeof arg === 'object' && arg !== null);
    if (Array.isArray(headers)) {
      for (let i = 0; i + 1 < headers.length; i += 2) res.setHeader(String(headers[i]), headers[i + 1]);
    } else if (headers) {
      for (const [name, value] of Object.entries(headers)) if (value !== undefined) res.setHeader(name, value as string);
    }
    return this;
  } as Response['writeHead'];
  res.write = function write(this: Response, chunk: unknown, encoding?: unknown, callback?: unknown) {
    collect(chunk, encoding);
    const cb = [encoding, callback].find((arg) => typeof arg === 'function') as (() => void) | undefined;
    if (cb) process.nextTick(cb);
    return true;
  } as Response['write'];
  res.end = function end(this: Response, chunk?: unknown, encoding?: unknown) {
    if (ended) return this;
    ended = true;
    collect(chunk, encoding);
    Object.assign(res, original);
    const captured: HttpResponse = { status: res.statusCode, headers: toHeaderRecord(res.getHeaders()), body: Buffer.concat(chunks) };
    finish(captured).then(
      (response) => {
        // the handler's own response: its status and headers are still on res
        if (response === captured) res.end(captured.body);
        else send(res, response);
      },
      (err) => {
        res.destroy(err as Error);
      },
    );
    return this;
  } as Response['end'];
  // a client that goes away does not stop the handler: its response is still stored (and, in
  // same-transaction mode, committed) when it ends, and the client's retry replays it
}

function send(res: Response, response: HttpResponse): void {
  if (res.headersSent) return;
  for (const name of res.getHeaderNames()) res.removeHeader(name);
  for (const [name, value] of Object.entries(response.headers)) res.setHeader(name, value);
  res.statusCode = response.status;
  res.end(response.body);
}
