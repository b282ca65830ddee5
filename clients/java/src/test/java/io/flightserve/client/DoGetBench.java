package io.flightserve.client;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;

/**
 * The Java side of benchmarks/java_client.py: {@code DoGetBench <location> <sql>} runs the query
 * (GetFlightInfo + DoGet into a VectorSchemaRoot, batch by batch) once per line read on stdin and
 * prints the row count, so the Python harness times each run in one warm JVM.
 */
public final class DoGetBench {
  private DoGetBench() {}

  public static void main(String[] args) throws Exception {
    try (FlightServeClient client = FlightServeClient.connect(args[0]);
         BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
      while (in.readLine() != null) {
        long rows = client.query(args[1], root -> { });
        System.out.println(rows);
        System.out.flush();
      }
    }
  }
}
