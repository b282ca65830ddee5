"""Flight SQL through arrow-java's JDBC driver (``org.apache.arrow:flight-sql-jdbc-driver``), the
driver DBeaver and DataGrip use: every argument-free ``DatabaseMetaData`` getter, which casts each
SqlInfo value to a Java type (``ArrowDatabaseMetadata.java``).

Needs ``java`` (17+) and the driver's jar: ``$FLIGHT_SERVE_JDBC_JAR``, or the one
``mvn dependency:get -Dartifact=org.apache.arrow:flight-sql-jdbc-driver:18.3.0`` puts in
``~/.m2``; the test is skipped, naming what is missing, without them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from flight_serve.flight.server import start_server

pytestmark = pytest.mark.integration

PROGRAM = Path(__file__).parent / "jdbc" / "MetadataGetters.java"
M2_JARS = Path.home() / ".m2/repository/org/apache/arrow/flight-sql-jdbc-driver"


def _driver_jar() -> Path | None:
    configured = os.environ.get("FLIGHT_SERVE_JDBC_JAR")
    if configured:
        return Path(configured)
    jars = sorted(M2_JARS.glob("*/flight-sql-jdbc-driver-*.jar"))
    return jars[-1] if jars else None


def test_every_database_metadata_getter_of_the_java_driver_answers(tmp_path: Path) -> None:
    java = shutil.which("java")
    jar = _driver_jar()
    if java is None or jar is None or not jar.is_file():
        pytest.skip(
            "needs java and the flight-sql-jdbc-driver jar ($FLIGHT_SERVE_JDBC_JAR or ~/.m2; "
            "mvn dependency:get -Dartifact=org.apache.arrow:flight-sql-jdbc-driver:18.3.0)"
        )
    with start_server(tmp_path, fsync="never") as service:
        port = service.location.rsplit(":", 1)[1]
        done = subprocess.run(
            [java, "--add-opens=java.base/java.nio=ALL-UNNAMED", "-cp", str(jar), str(PROGRAM), port],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert [line for line in lines if line.startswith("FAIL")] == []
    answers = dict(line.split("=", 1) for line in lines if "=" in line)
    assert len(answers) > 100
    assert answers["getDatabaseProductName"] == "flight-serve"
    assert answers["getDefaultTransactionIsolation"] == "0"  # TRANSACTION_NONE, an int64 on the wire
    assert answers["supportsTransactions"] == "false"
    assert answers["getMaxTableNameLength"] == "200"
    assert answers["getIdentifierQuoteString"] == '"'
    assert answers["getSchemaTerm"] == "schema"
