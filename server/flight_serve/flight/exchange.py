"""``DoExchange(cmd=<windowed query>)``: an inline streaming transform (schemas/README.md).

The client writes input batches; after **each** batch the server writes, in order:

1. the window results that batch closed (data messages, ``app_metadata`` JSON
   ``{"input_batch": i}``), so a result comes back in response to the batch that closed it;
2. the rows the batch sent to the late side output, if any: one metadata-only message whose
   ``app_metadata`` is an Arrow IPC stream (input columns + ``_late_reason``, ``_window_start``,
   ``_window_end``);
3. an acknowledgement: metadata-only JSON ``{"ack": i, "watermark_ns": W, "late_rows": n}``
   (``watermark_ns`` is null before any row; ``late_rows`` is cumulative).

When the client finishes writing, the partition's watermark becomes +∞: the remaining windows are
written, then ``{"done": true, "watermark_ns": null, "late_rows": n}``.

**Explicit watermark**: a client that has no rows to send but knows no earlier event time will
follow writes a metadata-only message, JSON ``{"watermark_ns": <int>}`` or
``{"watermark": "<ISO-8601>"}``. The server raises the watermark to that instant (never lowers it),
writes the windows that closes, then ``{"watermark_ack": <ns>, "watermark_ns": W, "late_rows": n}``.

Errors: the query is parsed before any output (``PipelineSQLError`` → INVALID_ARGUMENT with line
and column); an input schema without the configured columns → INVALID_ARGUMENT naming the column.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flight_serve._arrow import ipc_bytes
from flight_serve.engine.operator import DEFAULT_PARTITION, Emission, WindowOperator
from flight_serve.errors import InvalidInputError, QueryError
from flight_serve.flight.markers import watermark_request
from flight_serve.pipelines.dialect import function_named_in, sql_error
from flight_serve.pipelines.query import parse_window_query
from flight_serve.types import MAX_WATERMARK_NS, MIN_WATERMARK_NS


def _json(payload: dict[str, Any]) -> pa.Buffer:
    return pa.py_buffer(json.dumps(payload, separators=(",", ":")).encode())


def _watermark_json(watermark_ns: int) -> int | None:
    return None if watermark_ns in (MIN_WATERMARK_NS, MAX_WATERMARK_NS) else watermark_ns


def _write_results(
    writer: flight.MetadataRecordBatchWriter, emission: Emission, meta: dict[str, Any]
) -> None:
    for batch in emission.output.to_batches(max_chunksize=65536):
        if batch.num_rows:
            writer.write_with_metadata(batch, _json(meta))
    if emission.late.num_rows:
        late = emission.late
        writer.write_metadata(pa.py_buffer(ipc_bytes(late.schema, late.to_batches())))


def handle_exchange(
    service: object,
    context: flight.ServerCallContext,
    descriptor: flight.FlightDescriptor,
    reader: flight.MetadataRecordBatchReader,
    writer: flight.MetadataRecordBatchWriter,
) -> None:
    """Run one inline windowed query over the exchanged input (see the module docstring).

    Raises:
        PipelineSQLError: the command is not a valid windowed query.
        InvalidInputError: the descriptor is not a command, or the input lacks a column.
    """
    if descriptor.descriptor_type != flight.DescriptorType.CMD:
        raise InvalidInputError(
            "DoExchange takes a command descriptor holding a windowed query "
            "(path descriptors are reserved for plugins)"
        )
    query = parse_window_query((descriptor.command or b"").decode("utf-8", errors="replace"))
    try:
        operator: WindowOperator = query.build(reader.schema)
    except QueryError as exc:  # DataFusion's message, on several lines, without a position
        if query.select is None:
            raise
        said = " ".join(str(exc).split())
        at = function_named_in(query.select, said) or query.select.args["from_"].this.this
        raise sql_error(said, at) from exc
    writer.begin(operator.output_schema)
    late_rows = 0
    index = 0
    for chunk in reader:
        if context.is_cancelled():
            return
        if chunk.data is None:
            if chunk.app_metadata is not None:
                requested = watermark_request(chunk.app_metadata.to_pybytes())
                emission = operator.advance_watermark(DEFAULT_PARTITION, requested)
                late_rows += emission.late.num_rows
                _write_results(writer, emission, {"input_batch": None})
                writer.write_metadata(
                    _json(
                        {
                            "watermark_ack": requested,
                            "watermark_ns": _watermark_json(emission.watermark_ns),
                            "late_rows": late_rows,
                        }
                    )
                )
            continue
        emission = operator.process(chunk.data)
        late_rows += emission.late.num_rows
        _write_results(writer, emission, {"input_batch": index})
        writer.write_metadata(
            _json(
                {
                    "ack": index,
                    "watermark_ns": _watermark_json(emission.watermark_ns),
                    "late_rows": late_rows,
                }
            )
        )
        index += 1
    emission = operator.finish()
    _write_results(writer, emission, {"input_batch": None})
    writer.write_metadata(_json({"done": True, "watermark_ns": None, "late_rows": late_rows}))
