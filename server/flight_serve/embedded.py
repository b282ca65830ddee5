"""Pipelines in this process, no daemon: :class:`Pipeline` (DESIGN §1, §5).

The same pipeline SQL file runs here (``flight-serve run pipeline.sql``, or this class) and, later,
unchanged on a server. The grammar, the options and the connectors are in docs/pipelines.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from flight_serve.pipelines.pipeline import PipelinePlan, parse_pipeline, read_pipeline_file
from flight_serve.pipelines.runtime import PipelineRuntime, RunSummary

if TYPE_CHECKING:  # the sandbox module loads with the first LANGUAGE python function
    from flight_serve.functions.python import SandboxConfig

__all__ = ["Pipeline", "RunSummary"]


class Pipeline:
    """A parsed pipeline, ready to run embedded.

    Build one with :meth:`from_sql`. Each of :meth:`run`, :meth:`batches` (or iterating the
    pipeline) and :meth:`explain` opens the files afresh, so a pipeline can run any number of times;
    every run reads its bounded sources to the end, and at the end of input every open window fires.

    * :meth:`run` writes every sink (files, stdout) and returns a :class:`RunSummary`.
    * :meth:`batches` / ``iter(pipeline)`` yields ``(sink name, pyarrow.RecordBatch)`` for every
      batch inserted into a sink, as soon as the input batch that produced it has been processed,
      **instead of** writing the sinks: the caller is the sink. Batches of one sink come in the
      order they were produced (window results ordered by ``window_end``, ``window_start``, keys
      within a step).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "in.csv").write_text("k,t\\na,1970-01-01 00:00:01\\na,1970-01-01 00:00:12\\n")
    >>> p = Pipeline.from_sql(
    ...     "CREATE SOURCE s (k VARCHAR, t TIMESTAMP(0)) WITH (connector = 'file', path = 'in.csv');"
    ...     "CREATE SINK out WITH (connector = 'stdout');"
    ...     "INSERT INTO out SELECT k, window_start, count(*) AS n"
    ...     "  FROM TUMBLE(s, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end",
    ...     base_dir=d)
    >>> [(name, batch.to_pylist()[0]["n"]) for name, batch in p]
    [('out', 1), ('out', 1)]
    """

    def __init__(
        self,
        plan: PipelinePlan,
        *,
        output_dir: Path | None = None,
        python_functions: str | None = None,
        sandbox: SandboxConfig | None = None,
    ) -> None:
        self.plan = plan
        self.output_dir = output_dir
        #: the runner of the pipeline's LANGUAGE python functions: ``"python"`` (sandboxed) or
        #: ``"inprocess"`` (in this process, NOT sandboxed); ``None``: the environment's
        #: ``FLIGHT_SERVE_PYTHON_FUNCTIONS``, else the sandbox (docs/pipelines.md, "Functions")
        self.python_functions = python_functions
        #: how the sandboxed runner's workers run (hidden paths, ``unsandboxed`` without
        #: bwrap); ``None``: ``SandboxConfig()``
        self.sandbox = sandbox

    @classmethod
    def from_sql(
        cls,
        text_or_path: str | os.PathLike[str],
        *,
        base_dir: str | os.PathLike[str] | None = None,
        output_dir: str | os.PathLike[str] | None = None,
        python_functions: str | None = None,
        sandbox: SandboxConfig | None = None,
    ) -> Pipeline:
        """Parse a pipeline from SQL text or a file.

        Args:
            text_or_path: a :class:`os.PathLike` is a file; a ``str`` is a file when it names an
                existing file (and holds no newline or ``;``), else SQL text.
            base_dir: where relative source and table paths start (default: the file's directory,
                or the working directory for SQL text).
            output_dir: where relative sink paths start (default: the working directory).
            python_functions: ``"inprocess"`` runs ``LANGUAGE python`` functions inside this
                process, not sandboxed (off by default; see :attr:`python_functions`).
            sandbox: the sandbox of the default runner (:attr:`sandbox`).

        Raises:
            PipelineSQLError: the SQL does not parse or breaks a rule, with line and column.
            OSError: the file cannot be read (``FileNotFoundError`` for a missing ``*.sql``).
        """
        is_file = isinstance(text_or_path, os.PathLike) or (
            "\n" not in text_or_path and ";" not in text_or_path and Path(text_or_path).is_file()
        )
        path = Path(text_or_path) if is_file else None
        if (
            path is None
            and str(text_or_path).strip().endswith(".sql")
            and " " not in str(text_or_path)
        ):
            raise FileNotFoundError(f"no pipeline file {text_or_path}")
        text = read_pipeline_file(path) if path is not None else str(text_or_path)
        plan = parse_pipeline(
            text, path=path, base_dir=Path(base_dir) if base_dir is not None else None
        )
        return cls(
            plan,
            output_dir=Path(output_dir) if output_dir is not None else None,
            python_functions=python_functions,
            sandbox=sandbox,
        )

    def _runtime(self, load_tables: bool = True) -> PipelineRuntime:
        return PipelineRuntime(
            self.plan,
            output_dir=self.output_dir,
            load_tables=load_tables,
            python_functions=self.python_functions,
            sandbox=self.sandbox,
        )

    def explain(self) -> str:
        """The plan as text (see ``flight-serve explain``); reads file schemas, not their rows.

        Raises:
            PipelineSQLError: a connector or query that cannot work, with line and column.
        """
        return self._runtime(load_tables=False).explain()

    def run(self) -> RunSummary:
        """Run to the end of input, writing every sink; return rows written per sink.

        Raises:
            PipelineSQLError: building failed (a missing file, a bad option, an unknown column).
            ConnectorError: a file cannot be read or written.
            QueryError: DataFusion failed on a batch.
        """
        runtime = self._runtime()
        for _ in runtime.run(write=True):
            pass
        return runtime.summary()

    def batches(self) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Yield ``(sink name, batch)`` for every batch inserted into a sink; sinks are not
        written (see the class docstring). Raises what :meth:`run` raises."""
        runtime = self._runtime()
        yield from runtime.run(write=False, collect=True)

    def __iter__(self) -> Iterator[tuple[str, pa.RecordBatch]]:
        return self.batches()

    def __repr__(self) -> str:
        where = self.plan.path if self.plan.path is not None else "(SQL text)"
        return (
            f"Pipeline({where}: {len(self.plan.sources)} source(s), "
            f"{len(self.plan.queries)} query(ies), {len(self.plan.sinks)} sink(s))"
        )
