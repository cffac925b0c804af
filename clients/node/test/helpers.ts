import { execFileSync } from 'node:child_process';
import { Client, Pool } from 'pg';
import { IdempotencyStore } from '../src';

/** The extension version the suite runs against (run-tests runs it once per installed version). */
export const extensionVersion = process.env.IDEM_EXTENSION_VERSION ?? '1.1';
export const isV12 = extensionVersion !== '1.1';

/**
 * The edition the suite runs against (docs/editions.md): 'c', the extension, or 'sql', the SQL
 * edition installed by its plain route (`psql -f` of IDEMPOTENCY_SQL_EDITION_FILE, schema public).
 */
export const edition = process.env.IDEMPOTENCY_EDITION ?? 'c';
if (edition !== 'c' && edition !== 'sql') throw new Error(`IDEMPOTENCY_EDITION is c or sql, not ${edition}`);

/**
 * Why a test does not run against the SQL edition (one of the differences docs/editions.md
 * lists), or false: the test's `skip` option, so that node's runner counts and prints it.
 */
export function sqlEditionDifference(reason: string): string | false {
  return edition === 'sql' ? `SQL edition (docs/editions.md): ${reason}` : false;
}

/** Installs the edition under test into the database `name`, at `version` (the C edition). */
async function installEdition(pool: Pool, name: string, version: string): Promise<void> {
  if (edition === 'c') {
    await pool.query(`CREATE EXTENSION idempotency VERSION '${version}'`);
    return;
  }
  const file = process.env.IDEMPOTENCY_SQL_EDITION_FILE;
  if (!file) throw new Error('IDEMPOTENCY_SQL_EDITION_FILE (sql-edition/build\'s plain/idempotency-*.sql) is not set');
  execFileSync(process.env.PSQL ?? 'psql', ['-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', name, '-f', file], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
}

export interface TestDatabase {
  name: string;
  pool: Pool;
  store: IdempotencyStore;
  close(): Promise<void>;
}

/** A fresh database with the extension at `extensionVersion` and the tables the tests write. */
export async function createTestDatabase(label: string, version = extensionVersion): Promise<TestDatabase> {
  const name = `node_${label}_${version.replaceAll('.', '_')}`;
  const admin = new Client({ database: 'postgres' });
  await admin.connect();
  try {
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.query(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  const pool = new Pool({ database: name, max: 20 });
  await installEdition(pool, name, version);
  await pool.query(`
    CREATE TABLE orders (id bigserial PRIMARY KEY, idem_key text NOT NULL, item text);
    CREATE TABLE provider_charges (idem_key text PRIMARY KEY, attempt integer NOT NULL, charged_at timestamptz DEFAULT clock_timestamp());
    CREATE TABLE effects (id bigserial PRIMARY KEY, idem_key text NOT NULL, attempt integer)`);
  return { name, pool, store: new IdempotencyStore(pool), close: () => pool.end() };
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

export function uniqueKey(prefix: string): string {
  return `${prefix}-${process.pid}-${Date.now()}-${Math.random().toString(36).slice(2)}`;
}

/**
 * Handlers held until the test opens their gate (an explicit barrier, where a sleep would only
 * guess how long the test needs): `wait(name)` resolves once `open(name)` is called, before or after.
 */
export class Gates {
  private readonly gates = new Map<string, { opened: Promise<void>; open: () => void; arrived: boolean }>();

  wait(name: string): Promise<void> {
    const gate = this.gate(name);
    gate.arrived = true;
    return gate.opened;
  }

  /** Whether a handler has reached the gate (and waits there unless it is open). */
  arrived(name: string): boolean {
    return this.gate(name).arrived;
  }

  open(name: string): void {
    this.gate(name).open();
  }

  private gate(name: string) {
    let gate = this.gates.get(name);
    if (gate === undefined) {
      let open!: () => void;
      const opened = new Promise<void>((resolve) => (open = resolve));
      gate = { opened, open, arrived: false };
      this.gates.set(name, gate);
    }
    return gate;
  }
}

/** On the server's clock: the key's lease has ended (it can be taken over now). */
export async function leaseEnded(pool: Pool, key: string, scope = ''): Promise<boolean> {
  const { rows } = await pool.query(
    'SELECT locked_until < clock_timestamp() AS ended FROM idem_keys WHERE scope = $1 AND key = $2',
    [scope, key],
  );
  return rows.length === 1 && rows[0].ended === true;
}

/**
 * On the server's clock: the lease as first claimed (`claimedUntil`) has ended, and the key's
 * lease still has more than a second to run: the heartbeat has extended it.
 */
export async function leaseOutlived(pool: Pool, key: string, claimedUntil: Date, scope = ''): Promise<boolean> {
  const { rows } = await pool.query(
    `SELECT clock_timestamp() > $3 AND locked_until > clock_timestamp() + interval '1 s' AS outlived
       FROM idem_keys WHERE scope = $1 AND key = $2`,
    [scope, key, claimedUntil],
  );
  return rows.length === 1 && rows[0].outlived === true;
}

/** Poll `check` until it returns true (bounded: the machine may be slow, so a generous limit). */
export async function eventually(check: () => Promise<boolean>, what: string, limitMs = 30_000): Promise<void> {
  const end = Date.now() + limitMs;
  while (Date.now() < end) {
    if (await check()) return;
    await sleep(50);
  }
  throw new Error(`timed out waiting for ${what}`);
}
