/**
 * What docs/http.md says about an incoming request: the key header's forms and the fingerprint.
 * Pure functions over what Node gives (`rawHeaders`, the raw target, the body's bytes).
 */
import { createHash } from 'node:crypto';

export type KeyHeader =
  | { kind: 'missing' }
  | { kind: 'invalid'; detail: string }
  | { kind: 'key'; key: string };

/**
 * The key from the request's header lines (docs/http.md, "The key header"): exactly one field
 * line, either an sf-string `"..."` (escapes `\"` and `\\` only) or a bare value of visible
 * ASCII without `"` and `,`; 1..maxLength bytes after unescaping. Node's `rawHeaders` hold the
 * bytes as latin1 characters, so any non-ASCII byte shows as a character above 0x7e.
 */
export function parseKeyHeader(rawHeaders: readonly string[], headerName: string, maxLength: number): KeyHeader {
  const name = headerName.toLowerCase();
  const values: string[] = [];
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    if (rawHeaders[i].length === name.length && rawHeaders[i].toLowerCase() === name) values.push(rawHeaders[i + 1]);
  }
  if (values.length === 0) return { kind: 'missing' };
  if (values.length > 1) return { kind: 'invalid', detail: `the ${headerName} header must be given once` };
  const value = values[0].replace(/^[ \t]+|[ \t]+$/g, '');
  let key: string;
  if (value.startsWith('"')) {
    const unquoted = unescapeString(value);
    if (unquoted === undefined) {
      return { kind: 'invalid', detail: `the ${headerName} header is not a valid string: printable ASCII in double quotes, with \\" and \\\\ the only escapes` };
    }
    key = unquoted;
  } else {
    if (!/^[\x21-\x7e]*$/.test(value) || value.includes('"') || value.includes(',')) {
      return { kind: 'invalid', detail: `the ${headerName} header must be visible ASCII without '"' or ',' (or a quoted string)` };
    }
    key = value;
  }
  if (key.length < 1 || key.length > maxLength) {
    return { kind: 'invalid', detail: `the ${headerName} header must be 1 to ${maxLength} characters long` };
  }
  return { kind: 'key', key };
}

/** The content of an RFC 8941 sf-string, or undefined when `value` is not exactly one. */
function unescapeString(value: string): string | undefined {
  let out = '';
  for (let i = 1; i < value.length; i++) {
    const c = value.charCodeAt(i);
    if (c === 0x22) return i === value.length - 1 ? out : undefined;
    if (c < 0x20 || c > 0x7e) return undefined;
    if (c === 0x5c) {
      const next = value[++i];
      if (next !== '"' && next !== '\\') return undefined;
      out += next;
    } else {
      out += value[i];
    }
  }
  return undefined; // no closing quote
}

export interface FingerprintInput {
  method: string;
  /** The request target as received (path and query, not decoded). */
  target: string;
  /** Node's `rawHeaders`: name, value, name, value, ... */
  rawHeaders: readonly string[];
  /** Request headers that are part of the fingerprint. */
  fingerprintHeaders?: readonly string[];
  /** The body's exact bytes (empty when there is none). */
  body: Buffer;
}

const FINGERPRINT_PREFIX = 'idempotency-http/1\n';

/**
 * The request fingerprint of docs/http.md ("The fingerprint"): SHA-256 over a prefix and
 * length-prefixed fields (method, target, Content-Type, each chosen header's name and value,
 * body). 32 bytes, passed to idem_claim as `fingerprint`; the body never goes to the database.
 */
export function httpFingerprint(input: FingerprintInput): Buffer {
  const hash = createHash('sha256').update(FINGERPRINT_PREFIX);
  const field = (bytes: Buffer) => hash.update(`${bytes.length}:`).update(bytes).update('\n');
  // header values are latin1 characters standing for the bytes received
  const latin1 = (text: string) => Buffer.from(text, 'latin1');
  field(Buffer.from(input.method.toUpperCase(), 'latin1'));
  field(latin1(input.target));
  field(latin1(headerValue(input.rawHeaders, 'content-type')));
  const names = [...new Set((input.fingerprintHeaders ?? []).map((name) => name.toLowerCase()))].sort();
  for (const name of names) {
    field(latin1(name));
    field(latin1(headerValue(input.rawHeaders, name)));
  }
  field(input.body);
  return hash.digest();
}

/**
 * Every field line of the header, in order, joined by ", " ("" when absent): docs/http.md,
 * "Repeated headers". Built from the raw lines, since Node itself joins some headers with ", ",
 * keeps only the first line of others (Content-Type) and puts cookies in an array.
 */
export function headerValue(rawHeaders: readonly string[], lowerCaseName: string): string {
  const values: string[] = [];
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    if (rawHeaders[i].length === lowerCaseName.length && rawHeaders[i].toLowerCase() === lowerCaseName) values.push(rawHeaders[i + 1]);
  }
  return values.join(', ');
}

/** The methods docs/http.md ("Methods") passes through unless a route claims them. */
const SAFE_METHODS: ReadonlySet<string> = new Set(['GET', 'HEAD', 'OPTIONS', 'TRACE']);

/** Whether the library handles requests of this method (docs/http.md, "Methods"). */
export function isClaimedMethod(method: string, claimSafeMethods = false): boolean {
  return claimSafeMethods || !SAFE_METHODS.has(method.toUpperCase());
}

export interface ScopeInput {
  method: string;
  /** The route template (`/orders/:id`). */
  route: string;
  tenant?: string | null;
  /** The caller id (the authenticated principal); absent or null for a public route. */
  caller?: string | null;
}

/**
 * The scope of docs/http.md ("Scope"): `[tenant ":"] METHOD " " route`, then on a caller route
 * `" caller:"` and the SHA-256 of the caller id's UTF-8 bytes in lower-case hex, which keeps any id
 * within the scope's charset and length and out of the database in clear.
 */
export function httpScope(input: ScopeInput): string {
  const tenant = input.tenant === undefined || input.tenant === null ? '' : `${input.tenant}:`;
  const base = `${tenant}${input.method.toUpperCase()} ${input.route}`;
  if (input.caller === undefined || input.caller === null) return base;
  return `${base} caller:${createHash('sha256').update(input.caller, 'utf8').digest('hex')}`;
}

/** The request's Content-Length, or undefined when absent or not one plain number. */
export function contentLength(rawHeaders: readonly string[]): number | undefined {
  const value = headerValue(rawHeaders, 'content-length');
  return /^[0-9]+$/.test(value) ? Number(value) : undefined;
}
