package io.flightserve.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;
import org.apache.arrow.flight.Action;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightDescriptor;
import org.apache.arrow.flight.FlightEndpoint;
import org.apache.arrow.flight.FlightInfo;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.Location;
import org.apache.arrow.flight.PutResult;
import org.apache.arrow.flight.Result;
import org.apache.arrow.flight.Ticket;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.types.pojo.Schema;

/**
 * A flight-serve client on arrow-java's Flight client: put a stream (DoPut), a SQL query
 * (GetFlightInfo with the SQL as command + DoGet), read a stream from an offset (a tail ticket
 * of {@code schemas/flight_serve/v1/ticket.proto}), a windowed query over DoExchange, and the
 * stream actions. The wire forms are those of {@code schemas/README.md}. Errors are arrow-java's
 * {@link org.apache.arrow.flight.FlightRuntimeException} with the server's status and message
 * (NOT_FOUND for a missing stream, INVALID_ARGUMENT for bad SQL).
 */
public final class FlightServeClient implements AutoCloseable {
  static final ObjectMapper JSON = new ObjectMapper();

  private final BufferAllocator allocator;
  private final boolean ownsAllocator;
  private final FlightClient client;

  /** Connect to {@code uri} ({@code grpc://host:port}) with an allocator of its own. */
  public static FlightServeClient connect(String uri) {
    try {
      return new FlightServeClient(new Location(uri), new RootAllocator(), true);
    } catch (java.net.URISyntaxException e) {
      throw new IllegalArgumentException("not a Flight URI: " + uri, e);
    }
  }

  /** Connect to {@code location}, allocating from {@code allocator} (closed by the caller). */
  public FlightServeClient(Location location, BufferAllocator allocator) {
    this(location, allocator, false);
  }

  private FlightServeClient(Location location, BufferAllocator allocator, boolean owns) {
    this.allocator = allocator;
    this.ownsAllocator = owns;
    this.client = FlightClient.builder(allocator, location).build();
  }

  public BufferAllocator allocator() {
    return allocator;
  }

  /** The underlying arrow-java client, for calls this class does not wrap. */
  public FlightClient flight() {
    return client;
  }

  // --- DoPut ------------------------------------------------------------------------------

  /**
   * The server's acknowledgement of one durable entry: its offset and row count; for a marker
   * (an explicit watermark or the end of input), {@code watermarkNs} or {@code endOfInput}.
   */
  public record PutAck(long offset, long rows, Long watermarkNs, boolean endOfInput) {
    public PutAck(long offset, long rows) {
      this(offset, rows, null, false);
    }

    /** Decode a PutResult's app_metadata, JSON {@code {"offset": n, "rows": n, ...}}. */
    public static PutAck fromJson(byte[] json) {
      JsonNode node = parse(json, "PutResult app_metadata");
      if (node.has("error")) {
        throw new IllegalStateException("DoPut failed: " + node.get("error").asText());
      }
      if (!node.path("offset").canConvertToLong() || !node.path("rows").canConvertToLong()) {
        throw new IllegalArgumentException("PutResult app_metadata: needs integer offset and rows, got " + node);
      }
      JsonNode watermark = node.get("watermark_ns");
      return new PutAck(node.get("offset").asLong(), node.get("rows").asLong(),
          watermark == null || watermark.isNull() ? null : watermark.asLong(),
          node.path("end_of_input").asBoolean(false));
    }

    /** The JSON bytes the server writes (Python's json.dumps: keys in this order, ", " and ": "). */
    public byte[] toJson() {
      StringBuilder json = new StringBuilder("{\"offset\": ").append(offset).append(", \"rows\": ").append(rows);
      if (endOfInput) {
        json.append(", \"end_of_input\": true");
      }
      if (watermarkNs != null) {
        json.append(", \"watermark_ns\": ").append(watermarkNs);
      }
      return json.append('}').toString().getBytes(StandardCharsets.UTF_8);
    }
  }

  /**
   * Start a DoPut of stream {@code stream} (created on the first batch if it does not exist) with
   * {@code root}'s schema. Fill {@code root}, then {@link StreamWriter#write()} sends it and waits
   * until the server says it is durable.
   */
  public StreamWriter put(String stream, VectorSchemaRoot root) {
    return new StreamWriter(stream, root);
  }

  /** One DoPut call; see {@link #put}. */
  public final class StreamWriter implements AutoCloseable {
    private final BlockingQueue<Object> acks = new ArrayBlockingQueue<>(1024);
    private final FlightClient.ClientStreamListener listener;
    private byte[] lastMetadata;
    private boolean closed;

    private StreamWriter(String stream, VectorSchemaRoot root) {
      listener = client.startPut(FlightDescriptor.path(stream), root, new FlightClient.PutListener() {
        private final java.util.concurrent.CompletableFuture<Void> done = new java.util.concurrent.CompletableFuture<>();

        @Override
        public void onNext(PutResult result) {
          acks.add(bytes(result.getApplicationMetadata()));  // arrow-java closes the result
        }

        @Override
        public void onError(Throwable t) {
          acks.add(t);
          done.completeExceptionally(t);
        }

        @Override
        public void onCompleted() {
          done.complete(null);
        }

        @Override
        public void getResult() {
          try {
            done.get();
          } catch (java.util.concurrent.ExecutionException e) {
            throw e.getCause() instanceof RuntimeException r ? r : new IllegalStateException(e.getCause());
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException(e);
          }
        }
      });
    }

    /**
     * Send the root's current rows as one batch; return its acknowledgement.
     *
     * @throws org.apache.arrow.flight.FlightRuntimeException the server refused the batch
     * @throws IllegalStateException no acknowledgement within 60 s
     */
    public PutAck write() throws InterruptedException {
      listener.putNext();
      Object ack = acks.poll(60, TimeUnit.SECONDS);
      if (ack instanceof byte[] bytes) {
        lastMetadata = bytes;
        return PutAck.fromJson(bytes);
      }
      if (ack instanceof RuntimeException e) {
        throw e;
      }
      throw new IllegalStateException("DoPut: no PutResult within 60 s", (Throwable) ack);
    }

    /** The raw app_metadata of the last acknowledgement. */
    public byte[] lastMetadata() {
      return lastMetadata;
    }

    /** End the call and wait for the server to finish it. */
    @Override
    public void close() {
      if (!closed) {
        closed = true;
        listener.completed();
        listener.getResult();
      }
    }
  }

  // --- queries ----------------------------------------------------------------------------

  /** Run {@code sql} (DataFusion's dialect); hand every result batch to {@code onBatch}; return the row count. */
  public long query(String sql, Consumer<VectorSchemaRoot> onBatch) throws Exception {
    FlightInfo info = client.getInfo(FlightDescriptor.command(sql.getBytes(StandardCharsets.UTF_8)));
    long rows = 0;
    for (FlightEndpoint endpoint : info.getEndpoints()) {
      try (FlightStream stream = client.getStream(endpoint.getTicket())) {
        while (stream.next()) {
          VectorSchemaRoot root = stream.getRoot();
          rows += root.getRowCount();
          onBatch.accept(root);
        }
      }
    }
    return rows;
  }

  // --- stream metadata and actions -------------------------------------------------------

  /** A stream as GetFlightInfo(path = [name]) describes it. */
  public record StreamInfo(String name, Schema schema, String incarnation, long firstOffset, long nextOffset,
      long totalRecords) {}

  /** Describe stream {@code name}; NOT_FOUND if it does not exist. */
  public StreamInfo streamInfo(String name) {
    FlightInfo info = client.getInfo(FlightDescriptor.path(name));
    JsonNode meta = parse(info.getAppMetadata(), "stream info");
    return new StreamInfo(name, info.getSchemaOptional().orElse(null), meta.path("incarnation").asText(),
        meta.path("first_offset").asLong(), meta.path("next_offset").asLong(), info.getRecords());
  }

  /** Run action {@code type} with a JSON body; return the first result's bytes. */
  public byte[] action(String type, Object body) {
    byte[] payload = JSON.valueToTree(body).toString().getBytes(StandardCharsets.UTF_8);
    Iterator<Result> results = client.doAction(new Action(type, payload));
    byte[] first = results.hasNext() ? results.next().getBody() : new byte[0];
    results.forEachRemaining(r -> { });
    return first;
  }

  /** Drop stream {@code name} (action {@code stream.drop}). */
  public void drop(String name) {
    action("stream.drop", java.util.Map.of("stream", name));
  }

  // --- tail -------------------------------------------------------------------------------

  /** Called with each batch a tail reads: its stream offset and its rows. */
  @FunctionalInterface
  public interface TailVisitor {
    void batch(long offset, VectorSchemaRoot root) throws Exception;
  }

  /**
   * Read stream {@code stream} from batch {@code offset} up to its next offset when the call
   * begins (a tail ticket built here from the stream's incarnation); markers are left out; a
   * batch above 4 MiB arrives as consecutive pieces of the same offset. Returns the rows read.
   */
  public long tail(String stream, long offset, TailVisitor visitor) throws Exception {
    StreamInfo info = streamInfo(stream);
    long end = info.nextOffset();
    if (offset >= end) {
      return 0;
    }
    byte[] ticket = Tickets.encode(new Tickets.TailTicket(stream, info.incarnation(), offset));
    long rows = 0;
    try (FlightStream reader = client.getStream(new Ticket(ticket))) {
      try {
        while (reader.next()) {
          JsonNode meta = parse(bytes(reader.getLatestMetadata()), "tail message");
          long at = meta.path("offset").asLong(-1);
          if (at < 0) {
            throw new IllegalStateException("tail message without an offset: " + meta);
          }
          VectorSchemaRoot root = reader.getRoot();
          boolean marker = meta.has("watermark_ns") || meta.path("end_of_input").asBoolean(false);
          if (!marker) {
            rows += root.getRowCount();
            visitor.batch(at, root);
          }
          boolean lastPiece = !meta.has("pieces") || meta.path("piece").asLong() + 1 >= meta.path("pieces").asLong();
          if (at + 1 >= end && lastPiece) {
            break;
          }
        }
      } finally {
        reader.cancel("tail read to its end", null);
      }
    }
    return rows;
  }

  // --- DoExchange -------------------------------------------------------------------------

  /** What a windowed DoExchange query sent back, in order. */
  public record ExchangeResult(List<List<Object>> windows, List<JsonNode> acks, List<byte[]> late) {}

  /**
   * Run a windowed query over DoExchange ({@code CREATE SOURCE ...; SELECT ... FROM TUMBLE(...)},
   * schemas/README.md "DoExchange"): {@code root} carries the input schema; each element of
   * {@code batches} fills it with one batch, which is sent, and the window results, late rows
   * (an Arrow IPC stream each) and the acknowledgement it caused are read before the next. After
   * the last batch the rest of the windows and the {@code {"done": true}} message are read.
   */
  public ExchangeResult exchange(String sql, VectorSchemaRoot root, List<Consumer<VectorSchemaRoot>> batches)
      throws Exception {
    List<List<Object>> windows = new ArrayList<>();
    List<JsonNode> acks = new ArrayList<>();
    List<byte[]> late = new ArrayList<>();
    FlightDescriptor descriptor = FlightDescriptor.command(sql.getBytes(StandardCharsets.UTF_8));
    try (FlightClient.ExchangeReaderWriter call = client.doExchange(descriptor)) {
      FlightClient.ClientStreamListener writer = call.getWriter();
      FlightStream reader = call.getReader();
      writer.start(root);
      for (Consumer<VectorSchemaRoot> fill : batches) {
        fill.accept(root);
        writer.putNext();
        acks.add(readUntil(reader, windows, late, "ack"));
      }
      writer.completed();
      acks.add(readUntil(reader, windows, late, "done"));
      call.getResult();
    }
    return new ExchangeResult(windows, acks, late);
  }

  private static JsonNode readUntil(FlightStream reader, List<List<Object>> windows, List<byte[]> late, String key) {
    while (reader.next()) {
      VectorSchemaRoot root = reader.getRoot();
      for (int row = 0; row < root.getRowCount(); row++) {
        List<Object> values = new ArrayList<>();
        for (var vector : root.getFieldVectors()) {
          Object value = vector.getObject(row);
          values.add(value instanceof org.apache.arrow.vector.util.Text ? value.toString() : value);
        }
        windows.add(values);
      }
      byte[] meta = bytes(reader.getLatestMetadata());
      if (root.getRowCount() == 0 && meta.length >= 4 && (meta[0] & 0xff) == 0xff) {
        late.add(meta);
      } else if (meta.length > 0 && meta[0] == '{') {
        JsonNode message = parse(meta, "exchange message");
        if (message.has(key) || message.path("done").asBoolean(false)) {
          return message;
        }
      }
    }
    throw new IllegalStateException("DoExchange ended before the " + key + " message");
  }

  // --- helpers ----------------------------------------------------------------------------

  static byte[] bytes(ArrowBuf buf) {
    if (buf == null) {
      return new byte[0];
    }
    byte[] bytes = new byte[(int) buf.readableBytes()];
    buf.getBytes(buf.readerIndex(), bytes);
    return bytes;
  }

  static ArrowBuf buffer(BufferAllocator allocator, byte[] bytes) {
    ArrowBuf buf = allocator.buffer(bytes.length);
    buf.writeBytes(bytes);
    return buf;
  }

  static JsonNode parse(byte[] json, String what) {
    try {
      JsonNode node = JSON.readTree(json);
      if (node == null || !node.isObject()) {
        throw new IllegalArgumentException(what + ": not a JSON object");
      }
      return node;
    } catch (java.io.IOException e) {
      throw new IllegalArgumentException(what + ": not JSON: " + e.getMessage(), e);
    }
  }

  @Override
  public void close() throws Exception {
    client.close();
    if (ownsAllocator) {
      allocator.close();
    }
  }
}
