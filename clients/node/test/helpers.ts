import { Client, Pool } from 'pg';
import { IdempotencyStore } from '../src';

/** The extension version the suite runs against (run-tests runs it once per installed version). */
export const extensionVersion = process.env.IDEM_EXTENSION_VERSION ?? '1.1';
export const isV12 = extensionVersion !== '1.1';

export interface TestDatabase {
  name: string;
  pool: Pool;
  store: IdempotencyStore;
  close(): Promise<void>;
}

/** A fresh database with the extension at `extensionVersion` and the tables the tests write. */
export async function createTestDatabase(label: string, version = extensionVersion): Promise<TestDatabase> {
  const name = `node_${label}_${version.replace('.', '_')}`;
  const admin = new Client({ database: 'postgres' });
  await admin.connect();
  try {
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.query(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  const pool = new Pool({ database: name, max: 20 });
  await pool.query(`CREATE EXTENSION idempotency VERSION '${version}'`);
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

/** Poll `check` until it returns true (bounded: the machine may be slow, so a generous limit). */
export async function eventually(check: () => Promise<boolean>, what: string, limitMs = 30_000): Promise<void> {
  const end = Date.now() + limitMs;
  while (Date.now() < end) {
    if (await check()) return;
    await sleep(50);
  }
  throw new Error(`timed out waiting for ${what}`);
}
