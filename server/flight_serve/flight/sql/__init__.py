"""Arrow Flight SQL and SQL over streams: the protobuf dispatcher (handler), one parsed
statement per request (statement), the engine over streams and Iceberg tables."""
