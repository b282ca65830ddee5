"""Operating the server: authentication, roles, limits, metrics, request logs and health."""
