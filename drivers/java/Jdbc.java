// The SQL API from Java with pgJDBC (Debian's libpostgresql-jdbc-java): binding jsonb, bytea and
// arrays, reading results and enums, catching SQLSTATEs and a batch error's failing key.
// It connects to PGHOST (a TCP host), PGPORT, PGUSER, PGDATABASE, prints one line per check and
// exits 1 if any failed.
import java.sql.Array;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Objects;
import org.postgresql.util.PSQLException;

public final class Jdbc {
    private static int failures = 0;

    private static void check(boolean ok, String what, Object got) {
        if (ok) {
            System.out.println("ok: " + what);
        } else {
            failures++;
            System.out.println("FAILED: " + what + "; got: " + got);
        }
    }

    private static String url(String options) {
        String env = System.getenv("PGPORT");
        return "jdbc:postgresql://" + System.getenv("PGHOST") + ":" + (env == null ? "5432" : env)
            + "/" + System.getenv("PGDATABASE") + "?user=" + System.getenv("PGUSER") + options;
    }

    public static void main(String[] args) throws SQLException {
        byte[] allBytes = new byte[256];
        for (int i = 0; i < 256; i++) allBytes[i] = (byte) i;

        try (Connection conn = DriverManager.getConnection(url(""))) {
            // Without a cast, setString binds character varying: no idem_claim takes that.
            try (PreparedStatement ps = conn.prepareStatement(
                    "SELECT * FROM idem_claim(?, request => ?)")) {
                ps.setString(1, "order-0");
                ps.setString(2, "{\"sku\": \"A-1\"}");
                ps.executeQuery().close();
                check(false, "a jsonb argument bound with setString and no cast fails", "no error");
            } catch (SQLException e) {
                check("42883".equals(e.getSQLState()) && e.getMessage().contains("character varying"),
                    "a jsonb argument bound with setString and no cast: 42883 naming character varying",
                    e.getSQLState() + " " + e.getMessage());
            }

            // jsonb: ?::jsonb with setString; enums read with getString.
            int attempt;
            try (PreparedStatement ps = conn.prepareStatement(
                    "SELECT outcome, state, attempt FROM idem_claim(?, request => ?::jsonb)")) {
                ps.setString(1, "order-1");
                ps.setString(2, "{\"sku\": \"A-1\", \"qty\": 2}");
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    attempt = rs.getInt("attempt");
                    check("claimed".equals(rs.getString("outcome")) && "pending".equals(rs.getString("state"))
                          && attempt == 1,
                        "claim: outcome claimed, state pending, attempt 1 (enums read as text)",
                        rs.getString("outcome") + " " + rs.getString("state") + " " + attempt);
                }
            }

            // bytea: setBytes, every byte value kept.
            try (PreparedStatement ps = conn.prepareStatement(
                    "SELECT state FROM idem_complete(?, ?::jsonb, 201, attempt => ?, body => ?)")) {
                ps.setString(1, "order-1");
                ps.setString(2, "{\"order\": 42}");
                ps.setInt(3, attempt);
                ps.setBytes(4, allBytes);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    check("succeeded".equals(rs.getString("state")),
                        "complete with a jsonb response and a bytea body of all 256 byte values", rs.getString("state"));
                }
            }

            try (PreparedStatement ps = conn.prepareStatement(
                    "SELECT outcome, state, response, response_code, response_body"
                    + " FROM idem_claim(?, request => ?::jsonb)")) {
                ps.setString(1, "order-1");
                ps.setString(2, "{\"qty\": 2, \"sku\": \"A-1\"}");
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    String got = rs.getString("outcome") + " " + rs.getString("state") + " "
                        + rs.getString("response") + " " + rs.getInt("response_code");
                    check(got.equals("replay succeeded {\"order\": 42} 201"),
                        "replay: outcome replay, state succeeded, the jsonb response and code 201", got);
                    byte[] body = rs.getBytes("response_body");
                    check(Arrays.equals(body, allBytes), "replay: response_body byte for byte (256 values)",
                        body == null ? null : body.length);
                }
            }
            try (PreparedStatement ps = conn.prepareStatement("SELECT response_body FROM idem_lookup(?)")) {
                ps.setString(1, "order-1");
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    byte[] body = rs.getBytes(1);
                    check(Arrays.equals(body, allBytes), "idem_lookup: response_body byte for byte",
                        body == null ? null : body.length);
                }
            }

            // IK001: the same key with another request.
            try (PreparedStatement ps = conn.prepareStatement(
                    "SELECT * FROM idem_claim(?, request => ?::jsonb)")) {
                ps.setString(1, "order-1");
                ps.setString(2, "{\"sku\": \"B-2\"}");
                ps.executeQuery().close();
                check(false, "same key, another request: SQLSTATE IK001", "no error");
            } catch (SQLException e) {
                check("IK001".equals(e.getSQLState()), "same key, another request: SQLSTATE IK001",
                    e.getSQLState());
            }

            // IK004: the finished key completed again; 22023: a key with a newline.
            String[][] refused = {{"SELECT * FROM idem_complete(?, NULL)", "order-1", "IK004",
                                   "the finished key completed again: SQLSTATE IK004"},
                                  {"SELECT * FROM idem_claim(?)", "bad\nkey", "22023",
                                   "a key with a newline: SQLSTATE 22023"}};
            for (String[] call : refused) {
                try (PreparedStatement ps = conn.prepareStatement(call[0])) {
                    ps.setString(1, call[1]);
                    ps.executeQuery().close();
                    check(false, call[3], "no error");
                } catch (SQLException e) {
                    check(call[2].equals(e.getSQLState()), call[3], e.getSQLState());
                }
            }

            // Arrays: createArrayOf("text" / "jsonb" / "bytea", ...).
            String batchKey = "b-2 {\"x\\y\"}";  // quotes, braces, a backslash and a space
            try (PreparedStatement ps = conn.prepareStatement(
                    "SELECT key, outcome FROM idem_claim_batch(?, requests => ?)")) {
                ps.setArray(1, conn.createArrayOf("text", new String[] {"b-1", batchKey}));
                ps.setArray(2, conn.createArrayOf("jsonb", new String[] {"{\"n\": 1}", "{\"n\": 2}"}));
                List<String> got = new ArrayList<>();
                try (ResultSet rs = ps.executeQuery()) {
                    while (rs.next()) got.add(rs.getString("key") + "=" + rs.getString("outcome"));
                }
                check(got.equals(List.of("b-1=claimed", batchKey + "=claimed")),
                    "batch claim with text[] keys and jsonb[] requests: both claimed, in key order", got);
            }

            byte[][] fingerprints = {{0x00, (byte) 0xff, 0x5c, 0x22}, Arrays.copyOf(allBytes, 64)};
            try (PreparedStatement ps = conn.prepareStatement(
                    "SELECT * FROM idem_claim_batch(?, fingerprints => ?)")) {
                ps.setArray(1, conn.createArrayOf("text", new String[] {"f-1", "f-2"}));
                ps.setArray(2, conn.createArrayOf("bytea", fingerprints));
                ps.executeQuery().close();
            }
            try (ResultSet rs = conn.createStatement().executeQuery(
                    "SELECT (idem_lookup('f-1')).fingerprint, (idem_lookup('f-2')).fingerprint")) {
                rs.next();
                check(Arrays.equals(rs.getBytes(1), fingerprints[0]) && Arrays.equals(rs.getBytes(2), fingerprints[1]),
                    "batch claim with bytea[] fingerprints: stored byte for byte",
                    Arrays.toString(rs.getBytes(1)));
            }

            // A batch error names the failing key in the column-name field.
            try (PreparedStatement ps = conn.prepareStatement(
                    "SELECT * FROM idem_claim_batch(?, requests => ?)")) {
                ps.setArray(1, conn.createArrayOf("text", new String[] {"b-3", batchKey}));
                ps.setArray(2, conn.createArrayOf("jsonb", new String[] {"{\"n\": 3}", "{\"n\": 4}"}));
                ps.executeQuery().close();
                check(false, "batch with a reused key: IK001, getColumn() is the failing key", "no error");
            } catch (PSQLException e) {
                String column = e.getServerErrorMessage() == null ? null : e.getServerErrorMessage().getColumn();
                check("IK001".equals(e.getSQLState()) && batchKey.equals(column),
                    "batch with a reused key: IK001, getColumn() is the failing key", e.getSQLState() + " " + column);
            }
        }

        // stringtype=unspecified: strings go untyped, the server infers jsonb; no casts needed.
        try (Connection conn = DriverManager.getConnection(url("&stringtype=unspecified"));
             PreparedStatement ps = conn.prepareStatement(
                 "SELECT outcome, response FROM idem_claim(?, request => ?)")) {
            ps.setString(1, "order-1");
            ps.setString(2, "{\"qty\": 2, \"sku\": \"A-1\"}");
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                String got = rs.getString(1) + " " + rs.getString(2);
                check(got.equals("replay {\"order\": 42}"),
                    "stringtype=unspecified: setString binds jsonb without a cast (replay)", got);
            }
        }

        if (failures > 0) System.exit(1);
    }
}
