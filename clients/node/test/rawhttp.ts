/**
 * A raw HTTP/1.1 client for the conformance vectors: header lines go out exactly as given (a
 * repeated header stays repeated, values are sent as their UTF-8 bytes), which fetch and
 * http.request do not allow.
 */
import net from 'node:net';

export interface RawRequest {
  method: string;
  target: string;
  headers: Array<[string, string]>;
  body?: Buffer;
  /** Send the body with Transfer-Encoding: chunked (chunks of 16384 bytes) instead of Content-Length. */
  chunked?: boolean;
}

export interface RawResponse {
  status: number;
  /** Lower-case name -> every value received. */
  headers: Map<string, string[]>;
  body: Buffer;
}

export function send(port: number, request: RawRequest): Promise<RawResponse> {
  const lines = [`${request.method} ${request.target} HTTP/1.1`, `Host: 127.0.0.1:${port}`];
  for (const [name, value] of request.headers) lines.push(`${name}: ${value}`);
  if (request.body !== undefined) lines.push(request.chunked ? 'Transfer-Encoding: chunked' : `Content-Length: ${request.body.length}`);
  lines.push('Connection: close', '', '');
  const head = Buffer.from(lines.join('\r\n'), 'utf8');
  const body = request.body === undefined ? [] : request.chunked ? chunked(request.body) : [request.body];
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const socket = net.connect(port, '127.0.0.1', () => {
      socket.write(Buffer.concat([head, ...body]));
    });
    socket.on('data', (chunk) => chunks.push(chunk));
    // a server that answers before reading the whole body (a 413) may reset the connection while
    // the rest is sent: the answer that arrived before still counts
    socket.on('error', (err) => {
      try {
        resolve(parse(Buffer.concat(chunks)));
      } catch {
        reject(err);
      }
    });
    socket.on('end', () => {
      try {
        resolve(parse(Buffer.concat(chunks)));
      } catch (err) {
        reject(err);
      }
    });
  });
}

/** The body in the chunked transfer coding: chunks of 16384 bytes, then the last chunk. */
export function chunked(body: Buffer, size = 16384): Buffer[] {
  const parts: Buffer[] = [];
  for (let at = 0; at < body.length; at += size) {
    const piece = body.subarray(at, at + size);
    parts.push(Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from('\r\n'));
  }
  parts.push(Buffer.from('0\r\n\r\n'));
  return parts;
}

function parse(data: Buffer): RawResponse {
  const end = data.indexOf('\r\n\r\n');
  if (end < 0) throw new Error(`no complete response: ${JSON.stringify(data.toString('latin1').slice(0, 200))}`);
  const [statusLine, ...headerLines] = data.subarray(0, end).toString('latin1').split('\r\n');
  const status = Number(statusLine.split(' ')[1]);
  const headers = new Map<string, string[]>();
  for (const line of headerLines) {
    const colon = line.indexOf(':');
    const name = line.slice(0, colon).trim().toLowerCase();
    headers.set(name, [...(headers.get(name) ?? []), line.slice(colon + 1).trim()]);
  }
  let body = data.subarray(end + 4);
  if (headers.get('transfer-encoding')?.[0]?.toLowerCase() === 'chunked') body = dechunk(body);
  const length = headers.get('content-length')?.[0];
  if (length !== undefined && body.length < Number(length)) throw new Error(`a truncated response: ${body.length} of ${length} bytes`);
  return { status, headers, body };
}

function dechunk(data: Buffer): Buffer {
  const parts: Buffer[] = [];
  let at = 0;
  for (;;) {
    const lineEnd = data.indexOf('\r\n', at);
    const size = parseInt(data.subarray(at, lineEnd).toString('latin1'), 16);
    if (!(size > 0)) return Buffer.concat(parts);
    parts.push(data.subarray(lineEnd + 2, lineEnd + 2 + size));
    at = lineEnd + 2 + size + 2;
  }
}
