"""``check_job`` (run by ``pipeline.submit`` and ``pipeline.update`` of a Ray pipeline) builds the
pipeline to check it; building it starts a sandbox worker per Python function. It used to keep
them: three submits of a pipeline with one Python function left three bwrap workers under the
server. None may be left."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from flight_serve.pipelines.distributed.jobs import JobRequest, check_job

SQL = """SET parallelism = 2;
CREATE FUNCTION same(x VARCHAR) RETURNS VARCHAR LANGUAGE python AS $$
def same(x):
    return x
$$;
CREATE SOURCE s (k VARCHAR, t TIMESTAMP, WATERMARK FOR t AS t)
WITH (connector = 'file', path = 'in.csv');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE VIEW v AS SELECT same(k) AS k, t FROM s;
INSERT INTO out SELECT k, window_start, count(*) AS n
FROM TUMBLE(v, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
"""


def children() -> list[str]:
    listed = subprocess.run(
        ["ps", "--ppid", str(os.getpid()), "-o", "pid=,comm="],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    return [line for line in listed if line.strip() and not line.strip().endswith(" ps")]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (bwrap): the sandbox")
def test_checking_a_job_leaves_no_sandbox_worker(tmp_path: Path) -> None:
    (tmp_path / "in.csv").write_text("k,t\na,2020-01-01 00:00:00\n")
    request = JobRequest(
        "p", 1, SQL, str(tmp_path), str(tmp_path / "out"), str(tmp_path / "ckpt"), 1.0
    )
    before = children()
    for _ in range(3):
        assert check_job(request) == (2, {"out": str(tmp_path / "out" / "out.csv")})
    assert children() == before
