package io.flightserve.client;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * A throw-away certificate authority and a server certificate it signs, valid for 127.0.0.1 and
 * localhost, made with the openssl command line (as tests/integration/conftest.py's pki):
 * {@code ca.pem}, {@code server.pem}/{@code server.key}, and {@code trust.p12}, a PKCS#12 trust
 * store (password {@code changeit}) holding the CA, made with keytool.
 */
final class Pki {
  private Pki() {}

  static Path make(Path dir) throws IOException, InterruptedException {
    run(dir, "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.pem");
    Files.writeString(dir.resolve("san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
    run(dir, "openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=server",
        "-keyout", "server.key", "-out", "server.csr");
    run(dir, "openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "server.pem");
    Path keytool = Path.of(System.getProperty("java.home"), "bin", "keytool");
    run(dir, keytool.toString(), "-importcert", "-noprompt", "-alias", "test-ca", "-file", "ca.pem",
        "-keystore", "trust.p12", "-storetype", "PKCS12", "-storepass", "changeit");
    return dir;
  }

  private static void run(Path dir, String... command) throws IOException, InterruptedException {
    Process process = new ProcessBuilder(new ArrayList<>(List.of(command)))
        .directory(dir.toFile()).redirectErrorStream(true).start();
    String output = new String(process.getInputStream().readAllBytes());
    if (process.waitFor() != 0) {
      throw new IOException(String.join(" ", command) + " failed: " + output);
    }
  }
}
