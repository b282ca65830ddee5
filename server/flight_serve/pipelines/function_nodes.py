"""The graph node of a user table function: ``SELECT … FROM <f>(<stream>)`` with
``CREATE FUNCTION <f>() RETURNS TABLE (…) LANGUAGE python | wasm``.

Every batch of the stream goes through :meth:`TableFunction.call_table
<flight_serve.functions.base.TableFunction.call_table>` in the order it came; the batches it
yields go on the query's hidden stream ``<f>(<stream>)``, which the per-row query reads (as a
plugin's results do, :class:`~flight_serve.pipelines.graph.PluginNode`). The call is synchronous,
so partition events (end, watermark, new partition, backlog) follow the results of the batches
before them unchanged, and nothing is in flight at a checkpoint barrier.
"""

from __future__ import annotations

import time

import pyarrow as pa

from flight_serve.errors import FlightServeError
from flight_serve.functions.base import FunctionSpec, TableFunction
from flight_serve.pipelines.graph import Collector, Node, Stream, nullable
from flight_serve.pipelines.pipeline import QueryDef
from flight_serve.pipelines.user_functions import FunctionStats

__all__ = ["TableFunctionNode"]


class TableFunctionNode(Node):
    """``<f>(<stream>)`` through a user table function (see the module docstring).

    Args:
        out: the run's collector.
        query: the per-row query reading the results.
        input: the stream passed to the function.
        spec: the function's definition (``spec.returns`` is the results' schema).
        function: the ready function, or ``None`` when the plan is only explained.
        stats: where its calls are counted (``pipeline.status``'s ``"functions"``).
    """

    def __init__(
        self,
        out: Collector,
        query: QueryDef,
        input: Stream,
        spec: FunctionSpec,
        function: TableFunction | None,
        stats: FunctionStats | None = None,
    ) -> None:
        assert isinstance(spec.returns, pa.Schema)
        super().__init__(out, query, input, nullable(spec.returns))
        self.spec = spec
        self.function = function
        self.stats = stats
        self.hidden = Stream(f"{spec.name}({input.name})", self.schema, input.partitions)
        self.output = self.hidden

    def process(self, partition: str, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        if self.function is None:
            raise RuntimeError(f"FUNCTION {self.spec.name} was built to be explained, not run")
        started, failed = time.perf_counter(), True
        try:
            for result in self.function.call_table(batch):
                if result.num_rows:
                    self.rows_out += result.num_rows
                    self.out.push(self.hidden, partition, result.cast(self.schema))
            failed = False
        except FlightServeError as exc:  # the function's own error, with the query named
            raise type(exc)(f"{self.query.label}: {exc}") from exc
        finally:  # the time includes the downstream query's work on the yielded batches
            if self.stats is not None:
                self.stats.record(time.perf_counter() - started, batch.num_rows, failed=failed)

    def on_end(self, partition: str) -> None:
        self.out.end(self.hidden, partition)

    def on_partition(self, partition: str) -> None:
        self.out.add_partition(self.hidden, partition)

    def on_watermark(self, partition: str, watermark_ns: int) -> None:
        self.out.advance(self.hidden, partition, watermark_ns)

    def on_backlog(self, partition: str, backlog: bool) -> None:
        self.out.set_backlog(self.hidden, partition, backlog)
