import type { NextFunction, Request, RequestHandler, Response } from 'express';
import { HttpIdempotency, toHeaderRecord, type HttpIdempotencyOptions, type HttpResponse, type IdempotencyContext } from './http';
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

export interface ExpressIdempotencyOptions extends HttpIdempotencyOptions {
  /** Tenant of the request (e.g. from its authentication): part of the scope. */
  tenant?: (req: Request) => string | undefined;
}

/**
 * Express middleware; mount it on the route (`app.post('/orders', express.json(), idempotent(...),
 * handler)`) so that the scope is the method and the route pattern. The handler's response is
 * held until the key is stored (and, in same-transaction mode, committed), then sent.
 */
export function idempotent(store: IdempotencyStore, options: ExpressIdempotencyOptions = {}): RequestHandler {
  const http = new HttpIdempotency(store, options);
  return (req: Request, res: Response, next: NextFunction) => {
    const route = req.route?.path === undefined ? req.path : `${req.baseUrl}${String(req.route.path)}`;
    http
      .begin({ method: req.method, route, tenant: options.tenant?.(req), headers: req.headers, rawHeaders: req.rawHeaders, body: req.body })
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
