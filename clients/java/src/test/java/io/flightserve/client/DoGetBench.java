package io.flightserve.client;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import org.apache.arrow.flight.FlightDescriptor;
import org.apache.arrow.flight.FlightEndpoint;
import org.apache.arrow.flight.FlightInfo;
import org.apache.arrow.flight.FlightStream;

/**
 * The Java side of benchmarks/java_client.py and benchmarks/clients.py: {@code DoGetBench
 * <location> <sql>} runs the query (GetFlightInfo + DoGet into a VectorSchemaRoot, batch by
 * batch), {@code DoGetBench <location> --path <stream>} reads a stored stream
 * (GetFlightInfo(path = [stream]) + DoGet of every endpoint), once per line read on stdin, and
 * prints the row count, so the Python harness times each run in one warm JVM.
 */
public final class DoGetBench {
  private DoGetBench() {}

  public static void main(String[] args) throws Exception {
    boolean path = args.length == 3 && args[1].equals("--path");
    try (FlightServeClient client = FlightServeClient.connect(args[0]);
         BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
      while (in.readLine() != null) {
        long rows = path ? readStream(client, args[2]) : client.query(args[1], root -> { });
        System.out.println(rows);
        System.out.flush();
      }
    }
  }

  private static long readStream(FlightServeClient client, String stream) throws Exception {
    FlightInfo info = client.flight().getInfo(FlightDescriptor.path(stream));
    long rows = 0;
    for (FlightEndpoint endpoint : info.getEndpoints()) {
      try (FlightStream data = client.flight().getStream(endpoint.getTicket())) {
        while (data.next()) {
          rows += data.getRoot().getRowCount();
        }
      }
    }
    return rows;
  }
}
