"""flight_serve.store: durable, offset-addressed streams of Arrow record batches (DESIGN §3)."""

from flight_serve.store.streams import (
    DEFAULT_SEGMENT_BYTES,
    FsyncMode,
    PendingAppend,
    StreamEntry,
    StreamInfo,
    StreamStore,
    WriterInfo,
    check_batch,
    plain_type,
    rewrite_type,
    same_values,
    to_plain,
    validate_stream_name,
    validate_writer_name,
)

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "FsyncMode",
    "PendingAppend",
    "StreamEntry",
    "StreamInfo",
    "StreamStore",
    "WriterInfo",
    "check_batch",
    "plain_type",
    "rewrite_type",
    "same_values",
    "to_plain",
    "validate_stream_name",
    "validate_writer_name",
]
