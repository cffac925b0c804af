/**
 * The only module that uses node-postgres internals (its query-object protocol: `submit` and
 * the `handle*` callbacks, the connection's `parse`/`bind`/`execute`/`sync`, its
 * `parsedStatements` and `submittedNamedStatements`, and `Result.addFields`/`parseRow`), so
 * that a driver release that changes them breaks one place. The tested pg versions are pinned in
 * package.json (peerDependencies), and run-tests also runs the suite against the newest pg on
 * npm.
 */
import { Result, type Connection, type PoolClient, type QueryResultRow, type Submittable } from 'pg';

/**
 * Sends `begin`, the prepared statement `text` (as `statementName`) with `values`, and `after`
 * if given, before one Sync: one exchange with the server, and the statement's one row back.
 */
export function beginAndQuery(
  client: PoolClient,
  begin: string,
  statementName: string,
  text: string,
  values: unknown[],
  after: string | undefined,
): Promise<QueryResultRow> {
  return new Promise<QueryResultRow>((resolve, reject) => {
    client.query(new BeginAndQuery(begin, statementName, text, values, after, (err, row) => (err ? reject(err) : resolve(row as QueryResultRow))));
  });
}

/** What pg's connection offers a query object (pg-cursor uses the same). */
interface WireConnection {
  parse(config: { text: string; name?: string }): void;
  bind(config: { statement?: string; values?: unknown[]; binary?: boolean }): void;
  describe(config: { type: 'P' | 'S'; name?: string }): void;
  execute(config: { portal?: string; rows?: number }): void;
  sync(): void;
  stream: { cork?: () => void; uncork?: () => void };
  parsedStatements: Record<string, string>;
  submittedNamedStatements: Record<string, string>;
}

/**
 * A pg query object that sends a transaction's first command (BEGIN), a prepared statement and
 * optionally one more command (a SAVEPOINT) in the extended protocol, before one Sync: one
 * exchange, and the statement's one row back.
 * The statement is prepared once per connection under `statementName`, as pg does for named
 * queries.
 */
class BeginAndQuery implements Submittable {
  /** pg gives a query's `_result` the client's type parsers. */
  readonly _result = new Result('', undefined as never);
  /**
   * pg records a statement as prepared when a ParseComplete arrives for the active query's
   * `name`; it is set only once BEGIN's own ParseComplete has gone by.
   */
  name: string | undefined;
  binary = false;
  private parseSent = false;
  private beginDone = false;
  private connection: WireConnection | undefined;
  private row: QueryResultRow | undefined;
  private parseError: unknown;

  constructor(
    private readonly begin: string,
    private readonly statementName: string,
    private readonly text: string,
    private readonly values: unknown[],
    /** A command sent after the statement in the same exchange (a SAVEPOINT), or none. */
    private readonly after: string | undefined,
    public callback: (err: unknown, row?: QueryResultRow) => void,
  ) {}

  /** pg calls this when the query's turn comes; an Error returned is reported through handleError. */
  submit(connection: Connection): Error | undefined {
    const con = connection as unknown as WireConnection;
    this.connection = con;
    const known = con.parsedStatements[this.statementName] ?? con.submittedNamedStatements[this.statementName];
    if (known !== undefined && known !== this.text) {
      return new Error(`prepared statement "${this.statementName}" was used for another text`);
    }
    this.parseSent = known === undefined;
    con.stream.cork?.();
    try {
      con.parse({ text: this.begin });
      con.bind({});
      con.execute({});
      if (this.parseSent) {
        con.parse({ text: this.text, name: this.statementName });
        con.submittedNamedStatements[this.statementName] = this.text;
      }
      con.bind({ statement: this.statementName, values: this.values.map(wireValue), binary: this.binary });
      con.describe({ type: 'P' });
      con.execute({});
      if (this.after !== undefined) {
        con.parse({ text: this.after });
        con.bind({});
        con.execute({});
      }
      con.sync();
    } finally {
      con.stream.uncork?.();
    }
    return undefined;
  }

  handleRowDescription(msg: { fields: unknown[] }): void {
    (this._result as unknown as { addFields(f: unknown[]): void }).addFields(msg.fields);
  }

  handleDataRow(msg: { fields: unknown[] }): void {
    try {
      this.row = (this._result as unknown as { parseRow(f: unknown[]): QueryResultRow }).parseRow(msg.fields);
    } catch (err) {
      this.parseError = err;
    }
  }

  handleCommandComplete(): void {
    if (this.beginDone) return;
    this.beginDone = true;
    if (this.parseSent) this.name = this.statementName;
  }

  handleEmptyQuery(): void {}

  handlePortalSuspended(): void {}

  handleCopyInResponse(): void {}

  handleCopyData(): void {}

  handleError(err: unknown): void {
    // BEGIN failed before the statement's Parse was looked at: it is not prepared
    if (this.parseSent && !this.beginDone) delete this.connection?.submittedNamedStatements[this.statementName];
    this.callback(err);
  }

  handleReadyForQuery(): void {
    if (this.parseError !== undefined) this.callback(this.parseError);
    else if (this.row === undefined) this.callback(new Error('the statement returned no row'));
    else this.callback(null, this.row);
  }
}

/** A parameter as the wire takes it: text, bytes or NULL. */
function wireValue(value: unknown): string | Buffer | null {
  if (value === null || value === undefined) return null;
  if (Buffer.isBuffer(value)) return value;
  return String(value);
}
