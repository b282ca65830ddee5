package io.flightserve.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.math.BigDecimal;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.Date;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Timestamp;
import java.sql.Types;
import java.time.Instant;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Calendar;
import java.util.TimeZone;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * arrow-java's Flight SQL JDBC driver ({@code org.apache.arrow:flight-sql-jdbc-driver}, the jar
 * DBeaver and DataGrip load) against a live, open flight-serve on loopback.
 */
class JdbcDriverTest {
  /** A query that runs for many seconds on one core and holds no rows back (the cancel tests). */
  static final String SLOW = "SELECT max(sha256(CAST(value AS VARCHAR))) AS m FROM range(0, 400000000)";

  @TempDir static Path dir;
  static LiveServer server;

  @BeforeAll
  static void start() throws Exception {
    server = LiveServer.start(dir);
  }

  @AfterAll
  static void stop() throws Exception {
    server.close();
  }

  static Connection connect() throws SQLException {
    return DriverManager.getConnection(
        "jdbc:arrow-flight-sql://127.0.0.1:" + server.port + "/?useEncryption=false");
  }

  /** Every argument-free getter of DatabaseMetaData answers; the ones tools rely on exactly. */
  @Test
  void everyArgumentFreeDatabaseMetaDataGetterAnswers() throws Exception {
    Map<String, Object> answers = new TreeMap<>();
    List<String> failures = new ArrayList<>();
    try (Connection connection = connect()) {
      DatabaseMetaData metadata = connection.getMetaData();
      Method[] methods = DatabaseMetaData.class.getMethods();
      Arrays.sort(methods, Comparator.comparing(Method::getName));
      for (Method method : methods) {
        if (method.getParameterCount() != 0) {
          continue;
        }
        try {
          Object value = method.invoke(metadata);
          if (value instanceof ResultSet) {
            try (ResultSet rows = (ResultSet) value) {
              int n = 0;
              while (rows.next()) {
                for (int c = 1; c <= rows.getMetaData().getColumnCount(); c++) {
                  rows.getObject(c);
                }
                n++;
              }
              value = n;
            }
          }
          answers.put(method.getName(), value);
        } catch (InvocationTargetException e) {
          failures.add(method.getName() + ": " + e.getCause());
        }
      }
    }
    assertEquals(List.of(), failures);
    assertTrue(answers.size() > 130, answers.size() + " answers");
    long plain = answers.values().stream()
        .filter(v -> v instanceof Boolean || v instanceof Integer || v instanceof Long || v instanceof String)
        .count();
    assertTrue(plain > 100, plain + " boolean, int, long or String answers");
    assertEquals("flight-serve", answers.get("getDatabaseProductName"));
    assertEquals(Connection.TRANSACTION_NONE, answers.get("getDefaultTransactionIsolation"));
    assertEquals(false, answers.get("supportsTransactions"));
    assertEquals(200, answers.get("getMaxTableNameLength"));
    assertEquals("\"", answers.get("getIdentifierQuoteString"));
    assertEquals("schema", answers.get("getSchemaTerm"));
    assertEquals("Arrow Flight SQL JDBC Driver Core", answers.get("getDriverName"));
    assertEquals(true, answers.get("isReadOnly") instanceof Boolean);
    assertEquals(1, answers.get("getCatalogs"));  // one catalog: datafusion
    assertTrue(((String) answers.get("getSQLKeywords")).length() > 0);
  }

  @Test
  void catalogsSchemasTablesColumnsAndKeysAsABrowserAsksForThem() throws Exception {
    try (Connection connection = connect(); Statement statement = connection.createStatement()) {
      statement.executeUpdate("CREATE TABLE browse_me (id BIGINT NOT NULL, name VARCHAR, at TIMESTAMP)");
      DatabaseMetaData metadata = connection.getMetaData();
      List<String> catalogs = column(metadata.getCatalogs(), "TABLE_CAT");
      assertEquals(List.of("datafusion"), catalogs);
      List<String> schemas = column(metadata.getSchemas("datafusion", null), "TABLE_SCHEM");
      assertTrue(schemas.contains("public"), schemas.toString());
      List<String> types = column(metadata.getTableTypes(), "TABLE_TYPE");
      assertTrue(types.contains("TABLE"), types.toString());
      try (ResultSet tables = metadata.getTables(null, null, "browse%", null)) {
        assertTrue(tables.next());
        assertEquals("datafusion", tables.getString("TABLE_CAT"));
        assertEquals("public", tables.getString("TABLE_SCHEM"));
        assertEquals("browse_me", tables.getString("TABLE_NAME"));
        assertEquals("TABLE", tables.getString("TABLE_TYPE"));
        assertFalse(tables.next());
      }
      try (ResultSet columns = metadata.getColumns(null, null, "browse_me", "%")) {
        List<String> seen = new ArrayList<>();
        while (columns.next()) {
          seen.add(columns.getString("COLUMN_NAME") + ":" + columns.getInt("DATA_TYPE") + ":"
              + columns.getInt("ORDINAL_POSITION") + ":" + columns.getString("IS_NULLABLE"));
        }
        assertEquals(List.of(
            "id:" + Types.BIGINT + ":1:NO",
            "name:" + Types.VARCHAR + ":2:YES",
            "at:" + Types.TIMESTAMP + ":3:YES"), seen);
      }
      try (ResultSet keys = metadata.getPrimaryKeys(null, null, "browse_me")) {
        assertFalse(keys.next());  // streams have no keys
      }
      try (ResultSet keys = metadata.getImportedKeys(null, null, "browse_me")) {
        assertFalse(keys.next());
      }
      try (ResultSet keys = metadata.getExportedKeys(null, null, "browse_me")) {
        assertFalse(keys.next());
      }
      try (ResultSet keys = metadata.getCrossReference(null, null, "browse_me", null, null, "browse_me")) {
        assertFalse(keys.next());
      }
      // arrow-java's driver (18.3) never sends GetXdbcTypeInfo: getTypeInfo is Avatica's empty
      // default whatever the server answers (FlightSqlClientTest checks the server's answer).
      try (ResultSet info = metadata.getTypeInfo()) {
        assertEquals("TYPE_NAME", info.getMetaData().getColumnName(1));
        assertFalse(info.next());
      }
      statement.executeUpdate("DROP TABLE browse_me");
    }
  }

  @Test
  void statementsReturnExactValuesOfEveryType() throws Exception {
    try (Connection connection = connect(); Statement statement = connection.createStatement();
         ResultSet rows = statement.executeQuery(
             "SELECT CAST(7 AS INT) AS i, CAST(2.5 AS DOUBLE) AS d, 'héllo' AS s, true AS b, "
                 + "CAST(NULL AS BIGINT) AS n, CAST('12.345' AS DECIMAL(10, 3)) AS m, "
                 + "DATE '2026-01-02' AS day, TIMESTAMP '2026-01-02 03:04:05.123456' AS ts, "
                 + "X'00ff10' AS bin")) {
      ResultSetMetaData meta = rows.getMetaData();
      assertEquals(9, meta.getColumnCount());
      assertEquals("i", meta.getColumnLabel(1));
      assertTrue(rows.next());
      assertEquals(7, rows.getInt("i"));
      assertEquals(2.5, rows.getDouble("d"));
      assertEquals("héllo", rows.getString("s"));
      assertTrue(rows.getBoolean("b"));
      assertNull(rows.getObject("n"));
      rows.getLong("n");
      assertTrue(rows.wasNull());
      assertEquals(new BigDecimal("12.345"), rows.getBigDecimal("m"));
      assertEquals(LocalDate.of(2026, 1, 2), rows.getObject("day", LocalDate.class));
      assertArrayEquals(new byte[] {0, (byte) 0xff, 0x10}, rows.getBytes("bin"));
      assertFalse(rows.next());
    }
  }

  static void assertArrayEquals(byte[] expected, byte[] actual) {
    org.junit.jupiter.api.Assertions.assertArrayEquals(expected, actual);
  }

  /**
   * A table with a column of every type, filled by a prepared INSERT whose parameters are bound
   * with the setter a tool uses for each type (a null among them), then read back by a prepared
   * SELECT whose parameters compare against every column.
   */
  @Test
  void preparedStatementsBindParametersOfEveryType() throws Exception {
    Instant zoned = Instant.parse("2026-01-02T03:04:05.123Z");  // the driver sends milliseconds
    LocalDateTime local = LocalDateTime.of(2026, 1, 2, 3, 4, 5, 123000000);
    try (Connection connection = connect(); Statement statement = connection.createStatement()) {
      statement.executeUpdate("CREATE TABLE typed (i INT, l BIGINT, d DOUBLE, s VARCHAR, b BOOLEAN, "
          + "m DECIMAL(10, 3), day DATE, ts TIMESTAMP, tsz TIMESTAMP WITH TIME ZONE, bin BYTEA, n BIGINT)");
      try (PreparedStatement insert = connection.prepareStatement(
          "INSERT INTO typed VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")) {
        insert.setInt(1, 7);
        insert.setLong(2, 1L << 40);
        insert.setDouble(3, 2.5);
        insert.setString(4, "héllo");
        insert.setBoolean(5, true);
        insert.setBigDecimal(6, new BigDecimal("12.345"));
        insert.setDate(7, Date.valueOf(LocalDate.of(2026, 1, 2)));
        insert.setTimestamp(8, Timestamp.valueOf(local));
        insert.setTimestamp(9, Timestamp.from(zoned), Calendar.getInstance(TimeZone.getTimeZone("UTC")));
        insert.setBytes(10, new byte[] {0, (byte) 0xff, 0x10});
        insert.setNull(11, Types.BIGINT);
        assertEquals(1, insert.executeUpdate());
      }
      try (PreparedStatement select = connection.prepareStatement(
          "SELECT i, l, d, s, b, m, day, ts, tsz, bin, n, CAST(ts AS VARCHAR) AS ts_text, "
              + "CAST(tsz AS VARCHAR) AS tsz_text FROM typed WHERE i = ? AND l = ? AND d = ? AND s = ? "
              + "AND b = ? AND m = ? AND day = ? AND ts = ? AND tsz = ? AND bin = ?")) {
        select.setInt(1, 7);
        select.setLong(2, 1L << 40);
        select.setDouble(3, 2.5);
        select.setString(4, "héllo");
        select.setBoolean(5, true);
        select.setBigDecimal(6, new BigDecimal("12.345"));
        select.setDate(7, Date.valueOf(LocalDate.of(2026, 1, 2)));
        select.setTimestamp(8, Timestamp.valueOf(local));
        select.setTimestamp(9, Timestamp.from(zoned), Calendar.getInstance(TimeZone.getTimeZone("UTC")));
        select.setBytes(10, new byte[] {0, (byte) 0xff, 0x10});
        try (ResultSet rows = select.executeQuery()) {
          assertTrue(rows.next());
          assertEquals(7, rows.getInt("i"));
          assertEquals(1L << 40, rows.getLong("l"));
          assertEquals(2.5, rows.getDouble("d"));
          assertEquals("héllo", rows.getString("s"));
          assertTrue(rows.getBoolean("b"));
          assertEquals(new BigDecimal("12.345"), rows.getBigDecimal("m"));
          assertEquals(LocalDate.of(2026, 1, 2), rows.getDate("day").toLocalDate());
          assertEquals("2026-01-02T03:04:05.123", rows.getString("ts_text"));
          assertEquals("2026-01-02T03:04:05.123Z", rows.getString("tsz_text"));
          assertArrayEquals(new byte[] {0, (byte) 0xff, 0x10}, rows.getBytes("bin"));
          rows.getLong("n");
          assertTrue(rows.wasNull());
          assertFalse(rows.next());
        }
      }
      statement.executeUpdate("DROP TABLE typed");
    }
  }

  @Test
  void executeUpdateCreatesInsertsAndDrops() throws Exception {
    try (Connection connection = connect(); Statement statement = connection.createStatement()) {
      assertEquals(0, statement.executeUpdate("CREATE TABLE jdbc_rows (id BIGINT, label VARCHAR, at TIMESTAMP)"));
      assertEquals(2, statement.executeUpdate(
          "INSERT INTO jdbc_rows VALUES (1, 'a', TIMESTAMP '2026-01-01 00:00:00'), (2, 'b', NULL)"));
      try (PreparedStatement insert = connection.prepareStatement("INSERT INTO jdbc_rows VALUES (?, ?, ?)")) {
        insert.setLong(1, 3);
        insert.setString(2, "c");
        insert.setTimestamp(3, Timestamp.valueOf(LocalDateTime.of(2026, 1, 1, 0, 0, 3)));
        assertEquals(1, insert.executeUpdate());
      }
      try (ResultSet rows = statement.executeQuery(
          "SELECT count(*) AS n, sum(id) AS total, string_agg(label, ',' ORDER BY id) AS labels FROM jdbc_rows")) {
        assertTrue(rows.next());
        assertEquals(3, rows.getLong("n"));
        assertEquals(6, rows.getLong("total"));
        assertEquals("a,b,c", rows.getString("labels"));
      }
      assertEquals(0, statement.executeUpdate("DROP TABLE jdbc_rows"));
      SQLException gone = assertThrows(SQLException.class, () -> statement.executeQuery("SELECT * FROM jdbc_rows"));
      assertTrue(gone.getMessage().contains("jdbc_rows"), gone.getMessage());
    }
  }

  /** A million rows through the driver, every value seen: sum 1..N = N(N+1)/2. */
  @Test
  void aMillionRowResultArrivesWhole() throws Exception {
    long n = 1_000_000L;
    try (Connection connection = connect(); Statement statement = connection.createStatement();
         ResultSet rows = statement.executeQuery(
             "SELECT value, value * 3 AS triple FROM generate_series(1, " + n + ")")) {
      long count = 0;
      long sum = 0;
      long tripled = 0;
      while (rows.next()) {
        count++;
        sum += rows.getLong(1);
        tripled += rows.getLong(2);
      }
      assertEquals(n, count);
      assertEquals(n * (n + 1) / 2, sum);
      assertEquals(3 * n * (n + 1) / 2, tripled);
    }
  }

  /**
   * Server errors reach the application as SQLException carrying the Flight status. arrow-java's
   * driver (18.3) sets no SQLState for any status (it has no mapping), so tools show the message;
   * the status code travels in the cause (a FlightRuntimeException).
   */
  @Test
  void errorsAreSqlExceptionsWithTheFlightStatus() throws Exception {
    try (Connection connection = connect(); Statement statement = connection.createStatement()) {
      SQLException syntax = assertThrows(SQLException.class, () -> statement.executeQuery("SELEC 1"));
      assertTrue(syntax.getMessage().contains("Expected: an SQL statement, found: SELEC"), syntax.getMessage());
      assertEquals("INVALID_ARGUMENT", flightStatus(syntax));
      assertNull(syntax.getSQLState());
      SQLException missing = assertThrows(SQLException.class,
          () -> statement.executeQuery("SELECT * FROM no_such_table"));
      assertTrue(missing.getMessage().contains("table 'no_such_table' does not exist"), missing.getMessage());
      assertEquals("NOT_FOUND", flightStatus(missing));
      SQLException update = assertThrows(SQLException.class,
          () -> statement.executeUpdate("UPDATE anything SET x = 1"));
      assertTrue(update.getMessage().contains("UPDATE is not supported: streams are append-only"), update.getMessage());
      assertEquals("INVALID_ARGUMENT", flightStatus(update));
      // the connection still serves after the errors
      try (ResultSet rows = statement.executeQuery("SELECT 1 AS one")) {
        assertTrue(rows.next());
        assertEquals(1, rows.getInt(1));
      }
    }
  }

  /** The status code name of the (relocated) FlightRuntimeException in the cause chain. */
  static String flightStatus(Throwable error) throws Exception {
    for (Throwable t = error; t != null; t = t.getCause()) {
      if (t.getClass().getSimpleName().equals("FlightRuntimeException")) {
        Object status = t.getClass().getMethod("status").invoke(t);
        return status.getClass().getMethod("code").invoke(status).toString();
      }
    }
    throw new AssertionError("no FlightRuntimeException in the causes of " + error, error);
  }

  /** Whether the error or one of its causes mentions {@code text} (a status code name). */
  static boolean causeNamed(Throwable error, String text) {
    for (Throwable t = error; t != null; t = t.getCause()) {
      if (String.valueOf(t).contains(text)) {
        return true;
      }
    }
    return false;
  }

  static boolean causedBy(Throwable error, Class<?> type) {
    for (Throwable t = error; t != null; t = t.getCause()) {
      if (type.isInstance(t)) {
        return true;
      }
    }
    return false;
  }

  @Test
  void setQueryTimeoutStopsASlowQuery() throws Exception {
    try (Connection connection = connect(); Statement statement = connection.createStatement()) {
      statement.setQueryTimeout(1);
      long started = System.nanoTime();
      SQLException timedOut = assertThrows(SQLException.class, () -> {
        try (ResultSet rows = statement.executeQuery(SLOW)) {
          while (rows.next()) {
            rows.getString(1);
          }
        }
      });
      double seconds = (System.nanoTime() - started) / 1e9;
      assertTrue(seconds < 20, "took " + seconds + " s: " + timedOut);
      assertTrue(causedBy(timedOut, java.sql.SQLTimeoutException.class), timedOut.toString());
      assertTrue(timedOut.getMessage().contains("Query timed out after 1 SECONDS"), timedOut.getMessage());
      try (ResultSet rows = statement.executeQuery("SELECT 2 AS two")) {  // the connection still serves
        assertTrue(rows.next());
        assertEquals(2, rows.getInt(1));
      }
    }
  }

  @Test
  void cancelFromAnotherThreadStopsASlowQuery() throws Exception {
    ScheduledExecutorService timer = Executors.newSingleThreadScheduledExecutor();
    try (Connection connection = connect(); Statement statement = connection.createStatement()) {
      timer.schedule(() -> {
        try {
          statement.cancel();
        } catch (SQLException e) {
          fail(e);
        }
      }, 1500, TimeUnit.MILLISECONDS);
      long started = System.nanoTime();
      SQLException cancelled = assertThrows(SQLException.class, () -> {
        try (ResultSet rows = statement.executeQuery(SLOW)) {
          while (rows.next()) {
            rows.getString(1);
          }
        }
      });
      double seconds = (System.nanoTime() - started) / 1e9;
      assertTrue(seconds < 20, "took " + seconds + " s: " + cancelled);
      assertTrue(seconds > 1.0, "took " + seconds + " s: " + cancelled);
      assertTrue(cancelled.getMessage().contains("Cancelling this FlightStream"), cancelled.getMessage());
    } finally {
      timer.shutdownNow();
    }
  }

  static List<String> column(ResultSet rows, String name) throws SQLException {
    List<String> values = new ArrayList<>();
    try (rows) {
      while (rows.next()) {
        values.add(rows.getString(name));
      }
    }
    return values;
  }
}
