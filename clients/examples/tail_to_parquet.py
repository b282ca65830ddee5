"""A sink client: tail a flight-serve stream (e.g. a pipeline's output) into Parquet files, with
pyarrow.flight only (no flight_serve import).

    python clients/examples/tail_to_parquet.py --server grpc://127.0.0.1:8815 \\
        --stream hourly_departures --out-dir ./hourly [--rows-per-file 100000] \\
        [--idle-seconds S] [--max-rows N]

How it follows the stream, as a consumer in any language would:

1. action ``stream.tail`` ``{"stream", "offset"}`` returns a ticket; DoGet on it yields every
   entry from that offset on, the stored ones first, then each new one as it is appended. Each
   message's app_metadata is JSON ``{"offset", "writer", "next_offset"}``; a batch above 4 MiB
   comes as pieces that also carry ``"piece": i, "pieces": n``; a marker (a writer's watermark or
   end of input) is a message with zero rows whose metadata has ``"watermark_ns"`` or
   ``"end_of_input": true``;
2. rows are buffered and written as ``part-<first offset>-<last offset>.parquet`` once the
   buffer holds --rows-per-file rows (and when it stops), each file written to a temporary name
   and renamed into place, so a file is either whole or absent;
3. the file names are the progress: a restart reads the highest ``<last offset>`` in --out-dir
   and tails from the offset after it, so every row of the stream lands in exactly one file
   across restarts of this program (rows buffered but not yet in a file are read again);
4. a dropped connection or a server restart (UNAVAILABLE, or a tail the server ended while the
   stream still exists with the same incarnation) is retried with doubling pauses from the
   first offset not written yet; a stream dropped or re-created (another incarnation) stops it.

It stops when every writer of the stream has sent its end of input (the pipeline finished), after
--idle-seconds without a new entry, or once --max-rows rows are in files; Ctrl-C writes the
buffer and stops.
"""

from __future__ import annotations

import argparse
import json
import queue
import re
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq

PART = re.compile(r"part-(\d{12})-(\d{12})\.parquet")
RETRY_S = 60.0


def next_offset(out_dir: Path) -> int:
    """The first offset no file holds (0 for an empty directory)."""
    ends = [int(m.group(2)) for p in out_dir.iterdir() if (m := PART.fullmatch(p.name))]
    return max(ends) + 1 if ends else 0


def stream_info(client: flight.FlightClient, stream: str) -> dict[str, Any] | None:
    """The stream's FlightInfo metadata ({"incarnation", "writers", ...}), None if it is gone."""
    try:
        info = client.get_flight_info(flight.FlightDescriptor.for_path(stream))
    except pa.ArrowKeyError:
        return None
    return dict(json.loads(info.app_metadata or b"{}"))


class Files:
    """The buffer and the Parquet files."""

    def __init__(self, out_dir: Path, rows_per_file: int) -> None:
        self.out_dir, self.rows_per_file = out_dir, rows_per_file
        self.buffer: list[pa.RecordBatch] = []
        self.first = self.last = -1  # offsets of the buffered batches
        self.rows_buffered = 0
        self.rows_written = 0
        self.files = 0

    def add(self, first: int, last: int, batch: pa.RecordBatch) -> None:
        if self.first < 0:
            self.first = first
        self.last = last
        if batch.num_rows:
            self.buffer.append(batch)
            self.rows_buffered += batch.num_rows
        if self.rows_buffered >= self.rows_per_file:
            self.flush()

    def mark(self, offset: int) -> None:
        """A marker at ``offset``: it is covered by the next file (or by nothing, if none)."""
        if self.first < 0:
            self.first = offset
        self.last = offset

    def flush(self) -> None:
        if not self.buffer:
            return  # markers only: read again after a restart, which is harmless
        name = f"part-{self.first:012d}-{self.last:012d}.parquet"
        tmp = self.out_dir / f".{name}.tmp"
        pq.write_table(pa.Table.from_batches(self.buffer), tmp)
        tmp.replace(self.out_dir / name)
        print(f"wrote {name}: {self.rows_buffered:,} rows", flush=True)
        self.rows_written += self.rows_buffered
        self.files += 1
        self.buffer, self.first, self.last, self.rows_buffered = [], -1, -1, 0


def tail(
    server: str, stream: str, start: int, out: queue.Queue[Any], stop: threading.Event
) -> None:
    """Reading thread: put (offset, writer, batch | None, message) for every complete entry
    into ``out``, reconnecting as the module docstring says; then None (or an exception)."""
    position = start  # the first offset not read completely
    incarnation: str | None = None
    pause, deadline = 0.05, None
    try:
        while not stop.is_set():
            try:
                with flight.connect(server) as client:
                    info = stream_info(client, stream)
                    if info is None or (incarnation and info.get("incarnation") != incarnation):
                        raise SystemExit(f"stream {stream!r} was dropped or re-created")
                    incarnation = info.get("incarnation")
                    out.put(("writers", info.get("writers", {}), position))
                    body = json.dumps({"stream": stream, "offset": position}).encode()
                    (result,) = client.do_action(flight.Action("stream.tail", body))
                    reader = client.do_get(flight.Ticket(result.body.to_pybytes()))
                    pieces: list[pa.RecordBatch] = []
                    # read_chunk raises StopIteration when the server ends the tail (it shut
                    # down): the loop ends, and the tail is asked for again below
                    for chunk in iter(reader.read_chunk, None):
                        pause, deadline = 0.05, None  # the server answers again
                        message = json.loads(chunk.app_metadata.to_pybytes())
                        offset = int(message["offset"])
                        if stop.is_set():
                            return
                        if "watermark_ns" in message or message.get("end_of_input"):
                            out.put((offset, message.get("writer", ""), None, message))
                            position = offset + 1
                            continue
                        pieces.append(chunk.data)
                        if message.get("piece", 0) + 1 < message.get("pieces", 1):
                            continue  # more pieces of this batch follow
                        batch = pa.Table.from_batches(pieces).combine_chunks().to_batches()
                        pieces = []
                        whole = batch[0] if batch else chunk.data.slice(0, 0)
                        out.put((offset, message.get("writer", ""), whole, message))
                        position = offset + 1
            except (flight.FlightUnavailableError, flight.FlightTimedOutError) as exc:
                deadline = deadline or time.monotonic() + RETRY_S
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"the server stayed unreachable for {RETRY_S:g} s: {exc}"
                    ) from exc
            if stop.wait(pause):
                return
            pause = min(pause * 2, 2.0)
        out.put(None)
    except BaseException as exc:  # handed to the main thread
        out.put(exc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--server", default="grpc://127.0.0.1:8815")
    parser.add_argument("--stream", default="hourly_departures")
    parser.add_argument("--out-dir", default="tail-parquet")
    parser.add_argument("--rows-per-file", type=int, default=100_000)
    parser.add_argument("--idle-seconds", type=float, default=None)
    parser.add_argument("--max-rows", type=int, default=None)
    args = parser.parse_args()

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = next_offset(out_dir)
    print(f"tailing {args.stream!r} from offset {start} into {out_dir}/", flush=True)
    files = Files(out_dir, args.rows_per_file)
    entries: queue.Queue[Any] = queue.Queue(maxsize=256)
    stop = threading.Event()
    reader = threading.Thread(
        target=tail, args=(args.server, args.stream, start, entries, stop), daemon=True
    )
    reader.start()
    writers: set[str] = set()
    ended: set[str] = set()
    why = "stopped"
    try:
        while True:
            try:
                item = entries.get(timeout=args.idle_seconds)
            except queue.Empty:
                why = f"idle for {args.idle_seconds:g} s"
                break
            if item is None:
                break
            if isinstance(item, BaseException):
                raise item
            if item[0] == "writers":  # the stream's writers when the tail (re)started at item[2]
                _, history, position = item
                writers |= set(history)
                ended |= {
                    w for w, h in history.items() if (h.get("ended_at") or position) < position
                }
                if writers and writers <= ended:
                    why = "every writer ended its input"
                    break
                continue
            offset, writer, batch, message = item
            writers.add(writer)
            if batch is None:
                files.mark(offset)
                if message.get("end_of_input"):
                    ended.add(writer)
                    if writers <= ended:
                        why = "every writer ended its input"
                        break
                continue
            files.add(offset, offset, batch)
            if args.max_rows is not None and files.rows_written >= args.max_rows:
                why = f"{files.rows_written:,} rows written (--max-rows)"
                break
    except KeyboardInterrupt:
        why = "interrupted"
    finally:
        stop.set()
        files.flush()
    print(f"done ({why}): {files.rows_written:,} rows in {files.files} files, next offset "
          f"{next_offset(out_dir)}")


if __name__ == "__main__":
    main()
