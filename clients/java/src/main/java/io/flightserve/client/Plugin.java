package io.flightserve.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.channels.Channels;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.function.BooleanSupplier;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightDescriptor;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.WriteChannel;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.arrow.vector.types.pojo.Schema;

/**
 * A transform plugin in Java (schemas/README.md, "Plugin protocol", version 1): one DoExchange
 * call with the path {@code ["plugins", name]}; a metadata-only hello; then the server sends
 * input batches tagged {@code {"seq": N}} and the plugin answers each with one output batch
 * tagged the same. Heartbeats and other metadata-only messages are ignored; {@code
 * {"closing": true}} (the server stops) ends the call.
 */
public final class Plugin {
  /** Computes one output batch: fill {@code output} (allocated with the output schema) from {@code input}. */
  @FunctionalInterface
  public interface Transform {
    void apply(VectorSchemaRoot input, VectorSchemaRoot output) throws Exception;
  }

  private final String name;
  private final Schema inputSchema;
  private final Schema outputSchema;
  private final int maxInFlight;
  private final Transform transform;
  private volatile String instance;

  public Plugin(String name, Schema inputSchema, Schema outputSchema, int maxInFlight, Transform transform) {
    this.name = name;
    this.inputSchema = inputSchema;
    this.outputSchema = outputSchema;
    this.maxInFlight = maxInFlight;
    this.transform = transform;
  }

  /** The instance id the server gave in its accept message, once attached. */
  public String instance() {
    return instance;
  }

  /** base64 of the Arrow IPC encapsulated schema message, as the hello carries schemas. */
  public static String schemaBase64(Schema schema) {
    try {
      ByteArrayOutputStream bytes = new ByteArrayOutputStream();
      MessageSerializer.serialize(new WriteChannel(Channels.newChannel(bytes)), schema);
      return Base64.getEncoder().encodeToString(bytes.toByteArray());
    } catch (IOException e) {
      throw new IllegalStateException(e);
    }
  }

  /** The hello message's JSON bytes. */
  public byte[] hello() {
    ObjectNode hello = FlightServeClient.JSON.createObjectNode();
    hello.put("protocol", 1);
    hello.put("name", name);
    hello.put("input_schema", schemaBase64(inputSchema));
    hello.put("output_schema", schemaBase64(outputSchema));
    hello.put("max_in_flight", maxInFlight);
    return hello.toString().getBytes(StandardCharsets.UTF_8);
  }

  /**
   * Attach to the server of {@code client} and answer batches until the server ends the call,
   * sends {@code closing}, or {@code stop} turns true (checked at every message; the server
   * sends a heartbeat every second). Returns the number of batches answered.
   *
   * @throws FlightRuntimeException the server refused the hello (INVALID_ARGUMENT naming the field)
   */
  public long serve(FlightServeClient client, BooleanSupplier stop) throws Exception {
    long answered = 0;
    FlightDescriptor descriptor = FlightDescriptor.path("plugins", name);
    try (FlightClient.ExchangeReaderWriter call = client.flight().doExchange(descriptor);
         VectorSchemaRoot output = VectorSchemaRoot.create(outputSchema, client.allocator())) {
      FlightClient.ClientStreamListener writer = call.getWriter();
      FlightStream reader = call.getReader();
      writer.putMetadata(FlightServeClient.buffer(client.allocator(), hello()));
      writer.start(output);
      try {
        while (!stop.getAsBoolean() && reader.next()) {
          byte[] bytes = FlightServeClient.bytes(reader.getLatestMetadata());
          JsonNode meta = bytes.length > 0 && bytes[0] == '{'
              ? FlightServeClient.parse(bytes, "plugin message") : FlightServeClient.JSON.createObjectNode();
          if (!meta.has("seq")) {  // the accept message, a heartbeat, an error or closing
            if (meta.path("accepted").asBoolean(false)) {
              instance = meta.path("instance").asText();
            }
            if (meta.path("closing").asBoolean(false)) {
              break;
            }
            continue;
          }
          output.clear();
          transform.apply(reader.getRoot(), output);
          ObjectNode tag = FlightServeClient.JSON.createObjectNode();
          tag.set("seq", meta.get("seq"));
          writer.putNext(FlightServeClient.buffer(client.allocator(), tag.toString().getBytes(StandardCharsets.UTF_8)));
          answered++;
        }
      } finally {
        writer.completed();
      }
      try {
        call.getResult();
      } catch (FlightRuntimeException e) {
        if (!stop.getAsBoolean()) {
          throw e;
        }
      }
    }
    return answered;
  }
}
