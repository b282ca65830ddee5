package io.flightserve.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.Properties;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The JDBC driver against a server with TLS (a test CA) and a users file. */
class JdbcAuthTlsTest {
  @TempDir static Path dir;
  static Path pki;
  static LiveServer server;

  @BeforeAll
  static void start() throws Exception {
    pki = Files.createDirectories(dir.resolve("pki"));
    Pki.make(pki);
    Path users = dir.resolve("users.txt");
    Files.writeString(users, "alice:wonderland\n");
    server = LiveServer.start(dir, "--users-file", users.toString(),
        "--tls-cert", pki.resolve("server.pem").toString(), "--tls-key", pki.resolve("server.key").toString());
    assertTrue(server.location.startsWith("grpc+tls://"), server.location);
  }

  @AfterAll
  static void stop() throws Exception {
    server.close();
  }

  static String url(String options) {
    return "jdbc:arrow-flight-sql://localhost:" + server.port + "/?" + options;
  }

  static long answer(Connection connection) throws SQLException {
    try (Statement statement = connection.createStatement();
         ResultSet rows = statement.executeQuery("SELECT 40 + 2 AS n")) {
      assertTrue(rows.next());
      return rows.getLong(1);
    }
  }

  @Test
  void theUserAndPasswordOverTlsWithTheCaAsPem() throws Exception {
    String options = "useEncryption=true&tlsRootCerts=" + pki.resolve("ca.pem") + "&user=alice&password=wonderland";
    try (Connection connection = DriverManager.getConnection(url(options))) {
      assertEquals(42, answer(connection));
    }
  }

  @Test
  void theUserAndPasswordAsPropertiesWithTheCaInATrustStore() throws Exception {
    Properties properties = new Properties();
    properties.setProperty("user", "alice");
    properties.setProperty("password", "wonderland");
    properties.setProperty("trustStore", pki.resolve("trust.p12").toString());
    properties.setProperty("trustStorePassword", "changeit");
    properties.setProperty("useSystemTrustStore", "false");  // else the trustStore is ignored
    try (Connection connection = DriverManager.getConnection(url("useEncryption=true"), properties)) {
      assertEquals(42, answer(connection));
    }
  }

  @Test
  void aWrongPasswordIsRefused() {
    String options = "useEncryption=true&tlsRootCerts=" + pki.resolve("ca.pem") + "&user=alice&password=nope";
    SQLException refused = assertThrows(SQLException.class, () -> answer(DriverManager.getConnection(url(options))));
    assertTrue(refused.toString().contains("UNAUTHENTICATED") || JdbcDriverTest.causeNamed(refused, "UNAUTHENTICATED"),
        refused.toString());
  }

  @Test
  void noCredentialsAreRefused() {
    String options = "useEncryption=true&tlsRootCerts=" + pki.resolve("ca.pem");
    SQLException refused = assertThrows(SQLException.class, () -> answer(DriverManager.getConnection(url(options))));
    assertTrue(JdbcDriverTest.causeNamed(refused, "UNAUTHENTICATED"), refused.toString());
  }

  @Test
  void aServerCertificateOfAnUnknownCaIsRefused() {
    // the system trust store does not hold the test CA
    String options = "useEncryption=true&user=alice&password=wonderland";
    assertThrows(SQLException.class, () -> answer(DriverManager.getConnection(url(options))));
  }

  @Test
  void plaintextAgainstTheTlsServerIsRefused() {
    String options = "useEncryption=false&user=alice&password=wonderland";
    assertThrows(SQLException.class, () -> answer(DriverManager.getConnection(url(options))));
  }
}
