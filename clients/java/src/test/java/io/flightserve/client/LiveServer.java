package io.flightserve.client;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/**
 * A flight-serve server process for one test class: {@code python -m flight_serve.cli serve} of
 * the project's venv ({@code $FLIGHT_SERVE_PYTHON}, default {@code ../../.venv/bin/python}) on a
 * free loopback port, in a data dir under {@code dir}. The first stdout line is its location
 * ({@code grpc://127.0.0.1:PORT} or {@code grpc+tls://...}); its JSON-lines log goes to
 * {@code dir/serve.log}. {@link #close()} sends SIGTERM to that pid, and SIGKILL after 30 s.
 */
final class LiveServer implements AutoCloseable {
  final Process process;
  final String location;
  final int port;
  final Path log;

  private LiveServer(Process process, String location, Path log) {
    this.process = process;
    this.location = location;
    this.port = Integer.parseInt(location.substring(location.lastIndexOf(':') + 1));
    this.log = log;
  }

  static Path python() {
    String configured = System.getenv("FLIGHT_SERVE_PYTHON");
    Path python = Paths.get(configured != null && !configured.isEmpty() ? configured : "../../.venv/bin/python");
    if (!Files.isExecutable(python)) {
      throw new IllegalStateException(
          "no flight-serve Python at " + python.toAbsolutePath()
              + ": run `make .venv/.stamp-test` at the repository root or set FLIGHT_SERVE_PYTHON");
    }
    return python;
  }

  /** Start a server with the extra {@code serve} arguments; wait for its listening line. */
  static LiveServer start(Path dir, String... extra) throws IOException {
    List<String> command = new ArrayList<>(List.of(
        python().toString(), "-m", "flight_serve.cli", "serve",
        "--port", "0", "--health-port", "0", "--metrics-port", "0",
        "--fsync", "never", "--data-dir", dir.resolve("data").toString()));
    command.addAll(List.of(extra));
    Path log = dir.resolve("serve.log");
    Process process = new ProcessBuilder(command)
        .redirectError(log.toFile())
        .redirectInput(ProcessBuilder.Redirect.PIPE)
        .start();
    BufferedReader stdout = new BufferedReader(
        new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
    CompletableFuture<String> first = CompletableFuture.supplyAsync(() -> {
      try {
        return stdout.readLine();
      } catch (IOException e) {
        return null;
      }
    });
    String location;
    try {
      location = first.get(90, TimeUnit.SECONDS);
    } catch (Exception e) {
      location = null;
    }
    if (location == null || location.isBlank()) {
      process.destroyForcibly();
      throw new IllegalStateException("flight-serve did not start: " + Files.readString(log));
    }
    // a JVM that dies (a surefire timeout) still stops the server it started, by its pid
    Runtime.getRuntime().addShutdownHook(new Thread(process.toHandle()::destroy));
    return new LiveServer(process, location.strip(), log);
  }

  @Override
  public void close() throws Exception {
    ProcessHandle handle = process.toHandle();  // this server's pid only
    handle.destroy();  // SIGTERM: drain and stop
    if (!process.waitFor(30, TimeUnit.SECONDS)) {
      handle.destroyForcibly();
      process.waitFor(10, TimeUnit.SECONDS);
    }
  }
}
