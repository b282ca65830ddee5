package io.flightserve.client;

import com.google.protobuf.CodedInputStream;
import com.google.protobuf.CodedOutputStream;
import com.google.protobuf.WireFormat;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;

/**
 * The DoGet ticket codec of {@code schemas/flight_serve/v1/ticket.proto} (version 1), written
 * with protobuf-java's coded streams. Fields are written in field-number order, defaults (0,
 * "") left out, as the Python server's deterministic serialization does, so a ticket this class
 * encodes is byte for byte the one the server hands out.
 */
public final class Tickets {
  /** The codec version this class writes and reads. */
  public static final int VERSION = 1;

  private Tickets() {}

  /** One stream as pinned at planning time: batches [0, stopOffset) of that incarnation. */
  public record StreamPin(String stream, String incarnation, long stopOffset) {}

  /** A decoded ticket: exactly one of {@code query}, {@code range} or {@code tail} is set. */
  public sealed interface Ticket permits QueryTicket, StreamRangeTicket, TailTicket {}

  /** A SQL query over the pinned streams. */
  public record QueryTicket(String sql, List<StreamPin> streams) implements Ticket {}

  /** The batches [startOffset, stopOffset) of one stream incarnation. */
  public record StreamRangeTicket(String stream, String incarnation, long startOffset, long stopOffset)
      implements Ticket {}

  /** Follows one stream incarnation live from startOffset. */
  public record TailTicket(String stream, String incarnation, long startOffset) implements Ticket {}

  /** The wire bytes of {@code ticket}. */
  public static byte[] encode(Ticket ticket) {
    try {
      ByteArrayOutputStream bytes = new ByteArrayOutputStream();
      CodedOutputStream out = CodedOutputStream.newInstance(bytes);
      out.writeUInt32(1, VERSION);
      if (ticket instanceof QueryTicket q) {
        out.writeByteArray(2, query(q));
      } else if (ticket instanceof StreamRangeTicket r) {
        out.writeByteArray(3, message(o -> {
          string(o, 1, r.stream());
          string(o, 2, r.incarnation());
          uint64(o, 3, r.startOffset());
          uint64(o, 4, r.stopOffset());
        }));
      } else if (ticket instanceof TailTicket t) {
        out.writeByteArray(4, message(o -> {
          string(o, 1, t.stream());
          string(o, 2, t.incarnation());
          uint64(o, 3, t.startOffset());
        }));
      }
      out.flush();
      return bytes.toByteArray();
    } catch (IOException e) {
      throw new IllegalStateException(e);  // a ByteArrayOutputStream does not fail
    }
  }

  /**
   * Decode the wire bytes of a ticket.
   *
   * @throws IllegalArgumentException not a version-1 ticket of one kind (names what is wrong)
   */
  public static Ticket decode(byte[] data) {
    try {
      CodedInputStream in = CodedInputStream.newInstance(data);
      int version = -1;
      Ticket ticket = null;
      for (int tag = in.readTag(); tag != 0; tag = in.readTag()) {
        switch (WireFormat.getTagFieldNumber(tag)) {
          case 1 -> version = in.readUInt32();
          case 2 -> ticket = decodeQuery(in.readByteArray());
          case 3 -> {
            Fields f = Fields.read(in.readByteArray());
            ticket = new StreamRangeTicket(f.string(1), f.string(2), f.uint64(3), f.uint64(4));
          }
          case 4 -> {
            Fields f = Fields.read(in.readByteArray());
            ticket = new TailTicket(f.string(1), f.string(2), f.uint64(3));
          }
          default -> in.skipField(tag);
        }
      }
      if (version != VERSION) {
        throw new IllegalArgumentException("ticket: version must be " + VERSION + ", got " + version);
      }
      if (ticket == null) {
        throw new IllegalArgumentException("ticket: no kind (query, stream_range or tail) is set");
      }
      return ticket;
    } catch (IOException e) {
      throw new IllegalArgumentException("ticket: not a protobuf message: " + e.getMessage(), e);
    }
  }

  private static byte[] query(QueryTicket q) throws IOException {
    return message(o -> {
      string(o, 1, q.sql());
      for (StreamPin pin : q.streams()) {
        o.writeByteArray(2, message(p -> {
          string(p, 1, pin.stream());
          string(p, 2, pin.incarnation());
          uint64(p, 3, pin.stopOffset());
        }));
      }
    });
  }

  private static QueryTicket decodeQuery(byte[] data) throws IOException {
    CodedInputStream in = CodedInputStream.newInstance(data);
    String sql = "";
    List<StreamPin> pins = new ArrayList<>();
    for (int tag = in.readTag(); tag != 0; tag = in.readTag()) {
      switch (WireFormat.getTagFieldNumber(tag)) {
        case 1 -> sql = in.readStringRequireUtf8();
        case 2 -> {
          Fields f = Fields.read(in.readByteArray());
          pins.add(new StreamPin(f.string(1), f.string(2), f.uint64(3)));
        }
        default -> in.skipField(tag);
      }
    }
    return new QueryTicket(sql, List.copyOf(pins));
  }

  private interface Writer {
    void write(CodedOutputStream out) throws IOException;
  }

  private static byte[] message(Writer body) throws IOException {
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    CodedOutputStream out = CodedOutputStream.newInstance(bytes);
    body.write(out);
    out.flush();
    return bytes.toByteArray();
  }

  private static void string(CodedOutputStream out, int field, String value) throws IOException {
    if (!value.isEmpty()) {
      out.writeString(field, value);
    }
  }

  private static void uint64(CodedOutputStream out, int field, long value) throws IOException {
    if (value != 0) {
      out.writeUInt64(field, value);
    }
  }

  /** The string and uint64 fields of a flat message, by number. */
  private record Fields(java.util.Map<Integer, Object> values) {
    static Fields read(byte[] data) throws IOException {
      CodedInputStream in = CodedInputStream.newInstance(data);
      java.util.Map<Integer, Object> values = new java.util.HashMap<>();
      for (int tag = in.readTag(); tag != 0; tag = in.readTag()) {
        int field = WireFormat.getTagFieldNumber(tag);
        switch (WireFormat.getTagWireType(tag)) {
          case WireFormat.WIRETYPE_LENGTH_DELIMITED -> values.put(field, in.readStringRequireUtf8());
          case WireFormat.WIRETYPE_VARINT -> values.put(field, in.readUInt64());
          default -> in.skipField(tag);
        }
      }
      return new Fields(values);
    }

    String string(int field) {
      Object value = values.get(field);
      return value instanceof String s ? s : "";
    }

    long uint64(int field) {
      Object value = values.get(field);
      return value instanceof Long l ? l : 0L;
    }
  }
}
