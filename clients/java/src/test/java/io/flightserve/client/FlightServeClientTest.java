package io.flightserve.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStatusCode;
import org.apache.arrow.flight.Location;
import org.apache.arrow.flight.sql.FlightSqlClient;
import org.apache.arrow.flight.FlightInfo;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.Float8Vector;
import org.apache.arrow.vector.TimeStampMicroTZVector;
import org.apache.arrow.vector.TimeStampSecTZVector;
import org.apache.arrow.vector.TimeStampSecVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.types.TimeUnit;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.FieldType;
import org.apache.arrow.vector.types.pojo.Schema;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The Java client against a live flight-serve: put, query, tail, exchange, a plugin, Flight SQL. */
class FlightServeClientTest {
  @TempDir static Path dir;
  static LiveServer server;
  static BufferAllocator allocator;
  static FlightServeClient client;

  @BeforeAll
  static void start() throws Exception {
    server = LiveServer.start(dir);
    allocator = new RootAllocator();
    client = new FlightServeClient(new Location(server.location), allocator);
  }

  @AfterAll
  static void stop() throws Exception {
    client.close();
    allocator.close();
    server.close();
  }

  static Field field(String name, ArrowType type) {
    return new Field(name, FieldType.nullable(type), null);
  }

  static final Schema READINGS = new Schema(List.of(
      field("sensor", ArrowType.Utf8.INSTANCE),
      field("t", new ArrowType.Timestamp(TimeUnit.MICROSECOND, "UTC")),
      field("value", new ArrowType.FloatingPoint(org.apache.arrow.vector.types.FloatingPointPrecision.DOUBLE))));

  static void readings(VectorSchemaRoot root, String[] sensors, long[] seconds, double[] values) {
    VarCharVector sensor = (VarCharVector) root.getVector("sensor");
    TimeStampMicroTZVector t = (TimeStampMicroTZVector) root.getVector("t");
    Float8Vector value = (Float8Vector) root.getVector("value");
    root.allocateNew();
    for (int i = 0; i < sensors.length; i++) {
      sensor.setSafe(i, sensors[i].getBytes(StandardCharsets.UTF_8));
      t.setSafe(i, (1767225600L + seconds[i]) * 1_000_000L);
      value.setSafe(i, values[i]);
    }
    root.setRowCount(sensors.length);
  }

  static List<String> rows(String sql) throws Exception {
    List<String> rows = new ArrayList<>();
    client.query(sql, root -> {
      for (int r = 0; r < root.getRowCount(); r++) {
        List<String> values = new ArrayList<>();
        for (var vector : root.getFieldVectors()) {
          values.add(String.valueOf(vector.getObject(r)));
        }
        rows.add(String.join("|", values));
      }
    });
    return rows;
  }

  @Test
  void putAcknowledgesEachDurableBatchAndAQueryReadsThemBack() throws Exception {
    try (VectorSchemaRoot root = VectorSchemaRoot.create(READINGS, allocator);
         FlightServeClient.StreamWriter writer = client.put("readings", root)) {
      readings(root, new String[] {"a", "b"}, new long[] {1, 2}, new double[] {1.5, 2.0});
      FlightServeClient.PutAck first = writer.write();
      assertEquals(new FlightServeClient.PutAck(0, 2), first);
      assertArrayEquals(writer.lastMetadata(), first.toJson());  // the server's bytes, re-encoded
      readings(root, new String[] {"a", "c"}, new long[] {3, 4}, new double[] {3.5, 4.0});
      assertEquals(new FlightServeClient.PutAck(1, 2), writer.write());
    }
    assertEquals(List.of("a|2|5.0", "b|1|2.0", "c|1|4.0"),
        rows("SELECT sensor, count(*) AS n, sum(value) AS total FROM readings GROUP BY sensor ORDER BY sensor"));
    FlightServeClient.StreamInfo info = client.streamInfo("readings");
    assertEquals(2, info.nextOffset());
    assertEquals(4, info.totalRecords());
    assertEquals(READINGS.getFields().size(), info.schema().getFields().size());
  }

  @Test
  void aQueryOfAMillionRowsHasTheExactSum() throws Exception {
    AtomicLong sum = new AtomicLong();
    long n = 1_000_000;
    long rows = client.query("SELECT value FROM generate_series(1, " + n + ")", root -> {
      BigIntVector value = (BigIntVector) root.getVector(0);
      for (int r = 0; r < root.getRowCount(); r++) {
        sum.addAndGet(value.get(r));
      }
    });
    assertEquals(n, rows);
    assertEquals(n * (n + 1) / 2, sum.get());
  }

  @Test
  void badSqlAndAMissingStreamAreTheirStatusCodes() {
    FlightRuntimeException syntax = assertThrows(FlightRuntimeException.class, () -> rows("SELEC 1"));
    assertEquals(FlightStatusCode.INVALID_ARGUMENT, syntax.status().code());
    FlightRuntimeException missing = assertThrows(FlightRuntimeException.class, () -> client.streamInfo("nowhere"));
    assertEquals(FlightStatusCode.NOT_FOUND, missing.status().code());
  }

  @Test
  void aTailFromAnOffsetReadsTheBatchesFromThereWithATicketBuiltHere() throws Exception {
    try (VectorSchemaRoot root = VectorSchemaRoot.create(READINGS, allocator);
         FlightServeClient.StreamWriter writer = client.put("tailed", root)) {
      for (int b = 0; b < 3; b++) {
        readings(root, new String[] {"s" + b}, new long[] {b}, new double[] {b * 10.0});
        assertEquals(b, writer.write().offset());
      }
    }
    FlightServeClient.StreamInfo info = client.streamInfo("tailed");
    byte[] ours = Tickets.encode(new Tickets.TailTicket("tailed", info.incarnation(), 1));
    byte[] servers = client.action("stream.tail", Map.of("stream", "tailed", "offset", 1));
    assertArrayEquals(servers, ours);
    assertEquals(new Tickets.TailTicket("tailed", info.incarnation(), 1), Tickets.decode(servers));
    List<String> seen = new ArrayList<>();
    long rows = client.tail("tailed", 1, (offset, batch) ->
        seen.add(offset + ":" + batch.getVector("sensor").getObject(0) + ":" + batch.getVector("value").getObject(0)));
    assertEquals(2, rows);
    assertEquals(List.of("1:s1:10.0", "2:s2:20.0"), seen);
  }

  /** 12 MiB in one DoPut batch: above gRPC's 4 MiB default both ways (the server splits reads). */
  @Test
  void aBatchAboveFourMebibytesGoesInAndComesBackWhole() throws Exception {
    Schema schema = new Schema(List.of(field("x", new ArrowType.Int(64, true))));
    int n = 1_500_000;
    try (VectorSchemaRoot root = VectorSchemaRoot.create(schema, allocator);
         FlightServeClient.StreamWriter writer = client.put("big", root)) {
      BigIntVector x = (BigIntVector) root.getVector("x");
      x.allocateNew(n);
      for (int i = 0; i < n; i++) {
        x.set(i, i);
      }
      root.setRowCount(n);
      assertEquals(new FlightServeClient.PutAck(0, n), writer.write());
    }
    AtomicLong sum = new AtomicLong();
    List<Long> offsets = new ArrayList<>();
    long rows = client.tail("big", 0, (offset, batch) -> {
      offsets.add(offset);
      BigIntVector x = (BigIntVector) batch.getVector("x");
      for (int r = 0; r < batch.getRowCount(); r++) {
        sum.addAndGet(x.get(r));
      }
    });
    assertEquals(n, rows);
    assertEquals((long) n * (n - 1) / 2, sum.get());
    assertTrue(offsets.size() > 1 && offsets.stream().allMatch(o -> o == 0), offsets.toString());
    assertEquals(List.of(n + "|" + ((long) n * (n - 1) / 2)), rows("SELECT count(*), sum(x) FROM big"));
    AtomicLong queried = new AtomicLong();
    assertEquals(n, client.query("SELECT x FROM big", batch -> queried.addAndGet(batch.getRowCount())));
  }

  @Test
  void aWindowedQueryOverDoExchangeAnswersEachBatchWithTheWindowsItClosed() throws Exception {
    String sql = "CREATE SOURCE clicks (WATERMARK FOR t AS t - INTERVAL '2' SECOND);\n"
        + "SELECT page, window_start, window_end, count(*) AS clicks\n"
        + "FROM TUMBLE(clicks, t, INTERVAL '10' SECOND)\n"
        + "GROUP BY page, window_start, window_end";
    Schema schema = new Schema(List.of(field("page", ArrowType.Utf8.INSTANCE),
        field("t", new ArrowType.Timestamp(TimeUnit.SECOND, "UTC"))));
    List<Consumer<VectorSchemaRoot>> batches = new ArrayList<>();
    for (Object[][] rows : new Object[][][] {
        {{"home", 1L}, {"cart", 3L}},
        {{"home", 9L}, {"home", 14L}},
        {{"cart", 5L}},
        {{"cart", 25L}}}) {
      batches.add(root -> {
        root.allocateNew();
        for (int i = 0; i < rows.length; i++) {
          ((VarCharVector) root.getVector("page")).setSafe(i, ((String) rows[i][0]).getBytes(StandardCharsets.UTF_8));
          ((TimeStampSecTZVector) root.getVector("t")).setSafe(i, 1767225600L + (Long) rows[i][1]);
        }
        root.setRowCount(rows.length);
      });
    }
    FlightServeClient.ExchangeResult result;
    try (VectorSchemaRoot root = VectorSchemaRoot.create(schema, allocator)) {
      result = client.exchange(sql, root, batches);
    }
    List<String> windows = new ArrayList<>();
    for (List<Object> w : result.windows()) {
      windows.add(w.get(0) + "@" + w.get(1) + "=" + w.get(3));
    }
    windows.sort(null);
    // window_start in epoch seconds (timestamp[s, UTC]): 1767225600 is 2026-01-01T00:00:00Z
    assertEquals(List.of("cart@1767225600=1", "cart@1767225620=1", "home@1767225600=2", "home@1767225610=1"),
        windows);
    assertEquals(5, result.acks().size());
    assertEquals(List.of(0, 1, 2, 3), result.acks().subList(0, 4).stream().map(a -> a.get("ack").asInt()).toList());
    assertEquals(1, result.acks().get(2).get("late_rows").asInt());  // cart at 5 s came after [0, 10) fired
    assertTrue(result.acks().get(4).get("done").asBoolean());
    assertEquals(1, result.late().size());
  }

  static final Schema EVENTS = new Schema(List.of(field("k", ArrowType.Utf8.INSTANCE),
      field("t", new ArrowType.Timestamp(TimeUnit.SECOND, null)), field("v", new ArrowType.Int(64, true))));
  static final Schema DOUBLED = new Schema(List.of(field("k", ArrowType.Utf8.INSTANCE),
      field("t", new ArrowType.Timestamp(TimeUnit.SECOND, null)), field("v2", new ArrowType.Int(64, true))));

  /** A plugin written in Java doubles v for a pipeline; every input row comes out once, doubled. */
  @Test
  void aJavaPluginServesAPipeline() throws Exception {
    Plugin plugin = new Plugin("double_java", EVENTS, DOUBLED, 4, (input, output) -> {
      int n = input.getRowCount();
      VarCharVector k = (VarCharVector) output.getVector("k");
      TimeStampSecVector t = (TimeStampSecVector) output.getVector("t");
      BigIntVector v2 = (BigIntVector) output.getVector("v2");
      output.allocateNew();
      for (int i = 0; i < n; i++) {
        k.setSafe(i, ((VarCharVector) input.getVector("k")).get(i));
        t.setSafe(i, ((TimeStampSecVector) input.getVector("t")).get(i));
        v2.setSafe(i, 2 * ((BigIntVector) input.getVector("v")).get(i));
      }
      output.setRowCount(n);
    });
    AtomicBoolean stop = new AtomicBoolean();
    AtomicLong answered = new AtomicLong();
    List<Throwable> errors = new ArrayList<>();
    Thread serving = new Thread(() -> {
      try (FlightServeClient own = new FlightServeClient(new Location(server.location), allocator)) {
        answered.set(plugin.serve(own, stop::get));
      } catch (Throwable e) {
        errors.add(e);
      }
    });
    serving.start();
    String pipeline = "CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)\n"
        + "WITH (connector = 'flight', stream = 'plugin_events');\n"
        + "CREATE FUNCTION double_java() RETURNS TABLE (k VARCHAR, t TIMESTAMP(0), v2 BIGINT)\n"
        + "WITH (connector = 'plugin', timeout = '30s', max_in_flight = '4');\n"
        + "CREATE SINK doubled WITH (connector = 'flight', stream = 'plugin_doubled');\n"
        + "INSERT INTO doubled SELECT k, t, v2 FROM double_java(events);\n";
    JsonNode submitted = FlightServeClient.parse(
        client.action("pipeline.submit", Map.of("sql", pipeline, "name", "java_plugin")), "submit");
    String id = submitted.get("id").asText();
    int batches = 5;
    int perBatch = 100;
    try (VectorSchemaRoot root = VectorSchemaRoot.create(EVENTS, allocator);
         FlightServeClient.StreamWriter writer = client.put("plugin_events", root)) {
      for (int b = 0; b < batches; b++) {
        root.allocateNew();
        for (int i = 0; i < perBatch; i++) {
          int v = b * perBatch + i;
          ((VarCharVector) root.getVector("k")).setSafe(i, ("k" + v % 3).getBytes(StandardCharsets.UTF_8));
          ((TimeStampSecVector) root.getVector("t")).setSafe(i, v);
          ((BigIntVector) root.getVector("v")).setSafe(i, v);
        }
        root.setRowCount(perBatch);
        writer.write();
      }
    }
    long total = (long) batches * perBatch;
    long deadline = System.nanoTime() + 60_000_000_000L;
    List<String> result = List.of();
    while (System.nanoTime() < deadline) {
      try {
        result = rows("SELECT count(*), sum(v2), count(DISTINCT v2) FROM plugin_doubled");
        if (result.equals(List.of(total + "|" + total * (total - 1) + "|" + total))) {
          break;
        }
      } catch (FlightRuntimeException e) {
        if (e.status().code() != FlightStatusCode.NOT_FOUND && e.status().code() != FlightStatusCode.INVALID_ARGUMENT) {
          throw e;
        }
      }
      Thread.sleep(200);
    }
    client.action("pipeline.cancel", Map.of("id", id));
    stop.set(true);
    serving.join(30_000);
    assertEquals(List.of(), errors);
    assertEquals(List.of(total + "|" + total * (total - 1) + "|" + total), result);  // each v once, doubled
    assertTrue(answered.get() >= batches, "answered " + answered.get());
    assertTrue(plugin.instance() != null && !plugin.instance().isEmpty());
  }

  @Test
  void aHelloWithABadSchemaIsRefusedNamingTheField() {
    Plugin bad = new Plugin("bad_java", new Schema(List.of()), DOUBLED, 4, (in, out) -> { });
    FlightRuntimeException refused = assertThrows(FlightRuntimeException.class, () -> {
      try (FlightServeClient own = new FlightServeClient(new Location(server.location), allocator)) {
        bad.serve(own, () -> false);
      }
    });
    assertEquals(FlightStatusCode.INVALID_ARGUMENT, refused.status().code());
    assertTrue(refused.getMessage().contains("input_schema"), refused.getMessage());
  }

  /** arrow-java's Flight SQL client: a statement, and the type info the JDBC driver never asks for. */
  @Test
  void theFlightSqlClientRunsAStatementAndListsTypeInfo() throws Exception {
    FlightSqlClient sql = new FlightSqlClient(client.flight());
    FlightInfo info = sql.execute("SELECT 6 * 7 AS answer");
    try (FlightStream stream = sql.getStream(info.getEndpoints().get(0).getTicket())) {
      assertTrue(stream.next());
      assertEquals(42L, ((Number) stream.getRoot().getVector("answer").getObject(0)).longValue());
    }
    FlightInfo types = sql.getXdbcTypeInfo();
    List<String> names = new ArrayList<>();
    try (FlightStream stream = sql.getStream(types.getEndpoints().get(0).getTicket())) {
      while (stream.next()) {
        for (int r = 0; r < stream.getRoot().getRowCount(); r++) {
          names.add(String.valueOf(stream.getRoot().getVector("type_name").getObject(r)));
        }
      }
    }
    assertTrue(names.containsAll(List.of("BIGINT", "VARCHAR", "TIMESTAMP")), names.toString());
  }
}
