"""Run options of a pipeline: checkpoints and what to do on failure (``SET <option> = <value>``).

These options say how a pipeline *runs*, not what it computes; they never change a result row.

=======================  ===================================================  ==================
option                   value                                                default
=======================  ===================================================  ==================
``checkpoint_interval``  duration of processing time between checkpoints      none (``run``),
                         (``'1s'``, ``'500ms'``)                              ``1s`` (server)
``checkpoint_every``     a checkpoint after every N source batches (a file's  none
                         end counts as one): deterministic cuts for tests
``checkpoint_retain``    complete checkpoints kept (≥ 1); older ones are      3
                         deleted once a newer one is complete
``state_root``           where checkpoints go: a local path or any URI        see below
                         ``pyarrow.fs.FileSystem.from_uri`` reads
                         (``file:///…``, ``s3://…``)
``offset_reset``         ``'fail'``: a checkpoint whose source offset is      ``fail``
                         gone (retention removed it, a file vanished) stops
                         the resume with a CheckpointError; ``'earliest'``:
                         resume at the oldest input still there and report
                         the gap
``on_failure``           server pipelines: ``'fail'`` (state ``failed``) or   ``fail``
                         ``'retry'`` (resume from the last checkpoint after
                         a pause that doubles, up to ``max_retries`` times)
``max_retries``          retries in a row before ``failed`` (≥ 0)             5
``retry_backoff``        the first pause; each retry doubles it (≤ 1 min)     ``1s``
``parallelism``          instances of every windowed query on a distributed   1
                         runtime (``run --runtime ray``; docs/scaling.md)
``max_parallelism``      key groups of a distributed job (≥ parallelism,      128
                         ≤ 32768), fixed for the job's life
=======================  ===================================================  ==================

Default state root: ``<output-dir>/checkpoints/<pipeline>`` for ``flight-serve run``,
``<data-dir>/checkpoints/<pipeline id>`` on the server.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Literal

from sqlglot import exp

from flight_serve.errors import PipelineSQLError
from flight_serve.pipelines.dialect import sql_error
from flight_serve.pipelines.query import option_duration

__all__ = ["RUN_OPTION_NAMES", "RunOptions", "apply_run_option"]

#: ``SET`` options that say how the pipeline runs (see the module docstring).
RUN_OPTION_NAMES = (
    "checkpoint_interval",
    "checkpoint_every",
    "checkpoint_retain",
    "state_root",
    "offset_reset",
    "on_failure",
    "max_retries",
    "retry_backoff",
    "parallelism",
    "max_parallelism",
)
_MAX_BACKOFF = timedelta(minutes=1)


@dataclass(frozen=True)
class RunOptions:
    """How a pipeline runs (see the module docstring for each option).

    Attributes:
        checkpoint_interval: processing time between checkpoints, or ``None``.
        checkpoint_every: source batches between checkpoints, or ``None``.
        checkpoint_retain: complete checkpoints kept (≥ 1).
        state_root: the checkpoint root (a path or a ``pyarrow.fs`` URI), or ``None``: the default.
        offset_reset: ``fail`` or ``earliest``.
        on_failure: ``fail`` or ``retry``.
        max_retries: retries in a row before the pipeline is ``failed``.
        retry_backoff: the first pause before a retry (doubles each time, at most one minute).
        parallelism: instances of every windowed query on a distributed runtime, or ``None``
            (1, or ``--parallelism``).
        max_parallelism: key groups of a distributed job, or ``None`` (128).
    """

    checkpoint_interval: timedelta | None = None
    checkpoint_every: int | None = None
    checkpoint_retain: int = 3
    state_root: str | None = None
    offset_reset: Literal["fail", "earliest"] = "fail"
    on_failure: Literal["fail", "retry"] = "fail"
    max_retries: int = 5
    retry_backoff: timedelta = timedelta(seconds=1)
    parallelism: int | None = None
    max_parallelism: int | None = None

    @property
    def checkpoints(self) -> bool:
        """Whether checkpoints are taken (an interval or a batch count is set)."""
        return self.checkpoint_interval is not None or self.checkpoint_every is not None

    def backoff(self, attempt: int) -> timedelta:
        """The pause before retry ``attempt`` (1, 2, …): ``retry_backoff · 2^(attempt-1)``,
        at most one minute.

        >>> RunOptions(retry_backoff=timedelta(seconds=1)).backoff(3)
        datetime.timedelta(seconds=4)
        """
        return min(self.retry_backoff * (1 << min(max(attempt - 1, 0), 20)), _MAX_BACKOFF)


def _whole(key: str, value: exp.Expression, node: exp.Expression, low: int) -> int:
    try:
        number = int(value.name)
    except ValueError:
        raise sql_error(
            f"option {key}: expected a whole number, got {value.name!r}", value
        ) from None
    if number < low:
        raise sql_error(f"option {key}: must be at least {low}, got {number}", value)
    return number


def _choice(key: str, value: exp.Expression, choices: tuple[str, ...]) -> str:
    text = value.name.lower()
    if text not in choices:
        raise sql_error(
            f"option {key}: expected {' or '.join(repr(c) for c in choices)}, got {value.name!r}",
            value,
        )
    return text


def apply_run_option(
    options: RunOptions, key: str, value: exp.Expression, node: exp.Expression
) -> RunOptions:
    """``options`` with run option ``key`` set from the SQL ``value``.

    Raises:
        PipelineSQLError: an unknown key or a bad value, with line and column.
    """
    if key == "checkpoint_interval":
        interval = option_duration(value)
        if interval <= timedelta(0):
            raise sql_error("option checkpoint_interval: must be more than 0", value)
        return replace(options, checkpoint_interval=interval)
    if key == "checkpoint_every":
        return replace(options, checkpoint_every=_whole(key, value, node, 1))
    if key == "checkpoint_retain":
        return replace(options, checkpoint_retain=_whole(key, value, node, 1))
    if key == "state_root":
        if not value.name:
            raise sql_error("option state_root: expected a path or a URI", value)
        return replace(options, state_root=str(value.name))
    if key == "offset_reset":
        reset = _choice(key, value, ("fail", "earliest"))
        return replace(options, offset_reset="earliest" if reset == "earliest" else "fail")
    if key == "on_failure":
        mode = _choice(key, value, ("fail", "retry"))
        return replace(options, on_failure="retry" if mode == "retry" else "fail")
    if key == "max_retries":
        return replace(options, max_retries=_whole(key, value, node, 0))
    if key == "retry_backoff":
        backoff = option_duration(value)
        if backoff <= timedelta(0):
            raise sql_error("option retry_backoff: must be more than 0", value)
        return replace(options, retry_backoff=backoff)
    if key == "parallelism":
        return replace(options, parallelism=_whole(key, value, node, 1))
    if key == "max_parallelism":
        number = _whole(key, value, node, 1)
        if number > 32768:
            raise sql_error(f"option max_parallelism: must be at most 32768, got {number}", value)
        return replace(options, max_parallelism=number)
    raise PipelineSQLError(f"unknown run option {key!r}")
