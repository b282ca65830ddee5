"""Arrow Flight SQL: the protobuf dispatcher, one parsed statement per request, the engine over streams and Iceberg tables."""
