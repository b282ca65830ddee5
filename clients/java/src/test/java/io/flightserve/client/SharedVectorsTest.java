package io.flightserve.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

/**
 * The shared test vectors of {@code schemas/vectors/} (manifest.json: {@code {"version": 1,
 * "vectors": [{"name", "kind", "file", "decoded"}]}}): every ticket and PutResult metadata file
 * decodes to its {@code decoded} value and encodes back to the same bytes. {@code
 * $FLIGHT_SERVE_VECTORS} names another directory.
 */
class SharedVectorsTest {
  static Path directory() {
    String configured = System.getenv("FLIGHT_SERVE_VECTORS");
    return Paths.get(configured != null && !configured.isEmpty() ? configured : "../../schemas/vectors");
  }

  @Test
  void ticketsAndPutResultMetadataDecodeAndEncodeByteForByte() throws Exception {
    Path dir = directory();
    Path manifest = dir.resolve("manifest.json");
    Assumptions.assumeTrue(Files.isRegularFile(manifest), "schemas/vectors/manifest.json not present");
    JsonNode root = FlightServeClient.JSON.readTree(manifest.toFile());
    assertEquals(1, root.path("version").asInt());
    List<String> checked = new ArrayList<>();
    for (JsonNode vector : root.path("vectors")) {
      String kind = vector.path("kind").asText();
      String name = vector.path("name").asText();
      byte[] bytes = Files.readAllBytes(dir.resolve(vector.path("file").asText()));
      JsonNode decoded = vector.path("decoded");
      switch (kind) {
        case "ticket" -> {
          Tickets.Ticket expected = ticketOf(decoded);
          assertEquals(expected, Tickets.decode(bytes), name);
          assertArrayEquals(bytes, Tickets.encode(expected), name);
        }
        case "put_result_metadata" -> {
          assertEquals(FlightServeClient.JSON.readTree(bytes), decoded, name);
          if (decoded.has("error")) {  // the last PutResult of a DoPut the server could not store
            IllegalStateException refused =
                assertThrows(IllegalStateException.class, () -> FlightServeClient.PutAck.fromJson(bytes), name);
            assertEquals("DoPut failed: " + decoded.path("error").asText(), refused.getMessage(), name);
            checked.add(name);
            continue;
          }
          FlightServeClient.PutAck ack = FlightServeClient.PutAck.fromJson(bytes);
          assertEquals(decoded.path("offset").asLong(), ack.offset(), name);
          assertEquals(decoded.path("rows").asLong(), ack.rows(), name);
          assertEquals(FlightServeClient.JSON.readTree(bytes), decoded, name);
          assertArrayEquals(bytes, ack.toJson(), name + ": " + new String(ack.toJson()));
        }
        default -> {
          continue;  // plugin_hello / plugin_frame: the Python and Rust tests' part
        }
      }
      checked.add(name);
    }
    assertTrue(!checked.isEmpty(), "no ticket or put_result_metadata vector in " + manifest);
  }

  /** A ticket from its proto-JSON form (field names as in ticket.proto or lowerCamelCase; uint64 as number or string). */
  static Tickets.Ticket ticketOf(JsonNode decoded) {
    assertEquals(Tickets.VERSION, field(decoded, "version").asInt());
    JsonNode tail = field(decoded, "tail");
    if (!tail.isMissingNode()) {
      return new Tickets.TailTicket(text(tail, "stream"), text(tail, "incarnation"), number(tail, "start_offset"));
    }
    JsonNode range = field(decoded, "stream_range");
    if (!range.isMissingNode()) {
      return new Tickets.StreamRangeTicket(text(range, "stream"), text(range, "incarnation"),
          number(range, "start_offset"), number(range, "stop_offset"));
    }
    JsonNode query = field(decoded, "query");
    List<Tickets.StreamPin> pins = new ArrayList<>();
    for (JsonNode pin : field(query, "streams")) {
      pins.add(new Tickets.StreamPin(text(pin, "stream"), text(pin, "incarnation"), number(pin, "stop_offset")));
    }
    return new Tickets.QueryTicket(text(query, "sql"), pins);
  }

  static JsonNode field(JsonNode node, String protoName) {
    if (node.has(protoName)) {
      return node.get(protoName);
    }
    StringBuilder camel = new StringBuilder();
    boolean upper = false;
    for (char c : protoName.toCharArray()) {
      if (c == '_') {
        upper = true;
      } else {
        camel.append(upper ? Character.toUpperCase(c) : c);
        upper = false;
      }
    }
    return node.path(camel.toString());
  }

  static String text(JsonNode node, String name) {
    return field(node, name).asText("");
  }

  static long number(JsonNode node, String name) {
    JsonNode value = field(node, name);
    return value.isTextual() ? Long.parseUnsignedLong(value.asText()) : value.asLong(0);
  }
}
