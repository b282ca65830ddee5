// Calls every argument-free DatabaseMetaData getter of arrow-java's Flight SQL JDBC driver against
// a flight-serve server and prints "name=value", or "FAIL name: exception" for a getter that
// throws (a SqlInfo value in a union member the driver does not cast to). Run as a single-file
// source program: java -cp flight-sql-jdbc-driver.jar MetadataGetters.java <port>
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.util.Arrays;
import java.util.Comparator;

public class MetadataGetters {
  public static void main(String[] args) throws Exception {
    String url = "jdbc:arrow-flight-sql://127.0.0.1:" + args[0] + "/?useEncryption=false";
    try (Connection connection = DriverManager.getConnection(url)) {
      DatabaseMetaData metadata = connection.getMetaData();
      Method[] methods = DatabaseMetaData.class.getMethods();
      Arrays.sort(methods, Comparator.comparing(Method::getName));
      for (Method method : methods) {
        Class<?> type = method.getReturnType();
        if (method.getParameterCount() != 0
            || !(type == boolean.class || type == int.class || type == long.class || type == String.class)) {
          continue;
        }
        try {
          System.out.println(method.getName() + "=" + method.invoke(metadata));
        } catch (InvocationTargetException e) {
          System.out.println("FAIL " + method.getName() + ": " + e.getCause());
        }
      }
    }
  }
}
