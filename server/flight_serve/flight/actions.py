"""DoAction bodies (:func:`json_action_body`: strict UTF-8 JSON objects) and the ``pipeline.*``
actions (DESIGN §6): submit a pipeline and walk away, then look at it.

Bodies and results are UTF-8 JSON objects (schemas/README.md, "Actions"):

=======================  =============================================  ===========================
action                   body                                           result
=======================  =============================================  ===========================
``pipeline.submit``      ``{"sql", "name"?, "base_dir"?,                ``{"id", "name", "state",
                         "output_dir"?, "replace"?, "files"?}``         "outputs"}``
``pipeline.list``        ``{}``                                         ``{"pipelines": [{"id",
                                                                        "name", "state", …}]}``
``pipeline.status``      ``{"id"}``                                     state, watermark, lag, rows
                                                                        in / out, late rows, last
                                                                        checkpoint, last error
``pipeline.cancel``      ``{"id"}``                                     ``{"id", "state"}``
``pipeline.update``      ``{"id", "sql", "files"?, "note"?}``           ``{"id", "version",
                                                                        "resumed_from", …}``
``pipeline.checkpoint``  ``{"id", "wait_s"?}``                          ``{"id", "epoch",
                                                                        "completed", …}``
``pipeline.logs``        ``{"id", "after"?}``                           ``{"lines": [{"seq", "ts",
                                                                        "level", "message"}]}``
=======================  =============================================  ===========================

A pipeline's results are its output streams: tail them (``stream.tail``) from any offset.
Errors: INVALID_ARGUMENT for a malformed body or a pipeline that does not plan (with line and
column), NOT_FOUND for an unknown id.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pyarrow.flight as flight

from flight_serve.errors import ActionError
from flight_serve.flight.ops.roles import caller_name
from flight_serve.store import validate_stream_name

if TYPE_CHECKING:
    from flight_serve.pipelines.manager import PipelineManager

__all__ = [
    "ActionHandler",
    "RegisterAction",
    "body_stream",
    "json_action_body",
    "register_pipeline_actions",
]

#: An action handler: ``(context, body bytes) -> result bodies``.
ActionHandler = Callable[[flight.ServerCallContext, bytes], Iterable[bytes]]

#: How actions are added: ``register(type, description, handler)``
#: (:meth:`~flight_serve.flight.service.FlightServeService.register_action`).
RegisterAction = Callable[[str, str, ActionHandler], None]


def _not_json(text: str) -> Any:
    raise ValueError(f"{text} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is beyond a double")
    return value


def json_action_body(body: bytes, action: str) -> dict[str, Any]:
    """An action's body as a JSON object: strict JSON (``NaN``, ``Infinity`` and numbers beyond
    a double, which Python's parser would take, are refused).

    Raises:
        ActionError: the body is not UTF-8 JSON, or not an object (INVALID_ARGUMENT).
    """
    try:
        value = (
            json.loads(body.decode("utf-8"), parse_constant=_not_json, parse_float=_finite)
            if body
            else {}
        )
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise ActionError(f"{action}: the body is not UTF-8 JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ActionError(f"{action}: the body must be a JSON object")
    return value


def body_stream(body: dict[str, Any], action: str) -> str:
    """The valid stream name a body's ``"stream"`` holds.

    Raises:
        ActionError: ``"stream"`` is missing or not a string.
        InvalidInputError: not a valid stream name.
    """
    name = body.get("stream")
    if not isinstance(name, str):
        raise ActionError(f'{action}: the body needs "stream": a stream name')
    return validate_stream_name(name)


def _body(raw: bytes, action: str) -> dict[str, Any]:
    return json_action_body(raw, action)  # strict: no NaN, Infinity or 1e400


def _text(body: dict[str, Any], key: str, action: str, required: bool = True) -> str | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise ActionError(f'{action}: the body needs "{key}": a non-empty string')
    return value


def _flag(body: dict[str, Any], key: str, action: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise ActionError(f'{action}: "{key}" must be true or false')
    return value


def _files(body: dict[str, Any], action: str) -> dict[str, bytes] | None:
    """``"files": {"<USING path as written>": "<base64>"}``: the code files of the pipeline's
    ``CREATE FUNCTION … USING '<file>'``, uploaded with it (``None`` when not given)."""
    files = body.get("files")
    if files is None:
        return None
    if not isinstance(files, dict):
        raise ActionError(f'{action}: "files" must be an object of path: base64 text')
    out: dict[str, bytes] = {}
    for path, text in files.items():
        if not isinstance(text, str):
            raise ActionError(f'{action}: "files" {path!r}: expected base64 text')
        try:
            out[path] = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ActionError(f'{action}: "files" {path!r}: not base64') from None
    return out


def _result(value: Any) -> list[bytes]:
    return [json.dumps(value).encode()]


def register_pipeline_actions(register: RegisterAction, manager: PipelineManager) -> None:
    """Add the ``pipeline.*`` actions of ``manager`` with ``register`` (the service's
    ``register_action``)."""

    def submit(context: flight.ServerCallContext, raw: bytes) -> list[bytes]:
        body = _body(raw, "pipeline.submit")
        sql = _text(body, "sql", "pipeline.submit")
        assert sql is not None
        return _result(
            manager.submit(
                sql,
                name=_text(body, "name", "pipeline.submit", required=False),
                base_dir=_text(body, "base_dir", "pipeline.submit", required=False),
                output_dir=_text(body, "output_dir", "pipeline.submit", required=False),
                replace=_flag(body, "replace", "pipeline.submit"),
                function_files=_files(body, "pipeline.submit"),
                changed_by=caller_name(context),
            )
        )

    def update(context: flight.ServerCallContext, raw: bytes) -> list[bytes]:
        body = _body(raw, "pipeline.update")
        pid = _text(body, "id", "pipeline.update")
        sql = _text(body, "sql", "pipeline.update")
        assert pid is not None
        assert sql is not None
        return _result(
            manager.update(
                pid,
                sql,
                function_files=_files(body, "pipeline.update"),
                changed_by=caller_name(context),
                note=_text(body, "note", "pipeline.update", required=False),
            )
        )

    def list_(context: flight.ServerCallContext, raw: bytes) -> list[bytes]:
        _body(raw, "pipeline.list")
        return _result({"pipelines": manager.pipelines()})

    def status(context: flight.ServerCallContext, raw: bytes) -> list[bytes]:
        pid = _text(_body(raw, "pipeline.status"), "id", "pipeline.status")
        assert pid is not None
        return _result(manager.status(pid))

    def cancel(context: flight.ServerCallContext, raw: bytes) -> list[bytes]:
        pid = _text(_body(raw, "pipeline.cancel"), "id", "pipeline.cancel")
        assert pid is not None
        return _result(manager.cancel(pid))

    def checkpoint(context: flight.ServerCallContext, raw: bytes) -> list[bytes]:
        body = _body(raw, "pipeline.checkpoint")
        pid = _text(body, "id", "pipeline.checkpoint")
        assert pid is not None
        wait_s = body.get("wait_s", 30.0)
        if (
            isinstance(wait_s, bool)
            or not isinstance(wait_s, int | float)
            or not 0 <= wait_s <= 3600
        ):
            raise ActionError(
                'pipeline.checkpoint: "wait_s" must be a number of seconds >= 0 and at most 3600'
            )
        return _result(manager.checkpoint(pid, float(wait_s)))

    def logs(context: flight.ServerCallContext, raw: bytes) -> list[bytes]:
        body = _body(raw, "pipeline.logs")
        pid = _text(body, "id", "pipeline.logs")
        assert pid is not None
        after = body.get("after", 0)
        if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after < 2**63:
            raise ActionError('pipeline.logs: "after" must be an integer from 0 to 2**63-1')
        lines = manager.logs(pid, after)
        return _result({"lines": [vars(line) for line in lines]})

    register(
        "pipeline.submit",
        'Submit a pipeline to run on the server. Body: {"sql": text, "name"?, "base_dir"?, '
        '"output_dir"?, "replace"?: false}. A name that runs already is refused unless '
        '"replace" (cancel it first). Result: {"id", "name", "state", "outputs"}.',
        submit,
    )
    register("pipeline.list", 'List the pipelines. Body: {}. Result: {"pipelines": [...]}.', list_)
    register(
        "pipeline.status",
        "A pipeline's state, watermark, lag, rows in and out, late rows, last checkpoint and "
        'last error. Body: {"id"}.',
        status,
    )
    register(
        "pipeline.cancel",
        'Checkpoint and stop a pipeline (state cancelled). Body: {"id"}. Result: {"id", "state"}.',
        cancel,
    )
    register(
        "pipeline.update",
        "Replace a running pipeline's text and code, keeping its state: it checkpoints, stops "
        "and resumes from that checkpoint as the next version, if its windows, keys, aggregates "
        'and sources are unchanged (else refused with the differences). Body: {"id", "sql", '
        '"files"?, "note"?}. Result: {"id", "version", "previous_version", "resumed_from", '
        '"sql_sha256", "functions", "changed"}.',
        update,
    )
    register(
        "pipeline.checkpoint",
        'Take a checkpoint of a running pipeline now. Body: {"id", "wait_s"?}. Result: '
        '{"id", "epoch", "completed"}.',
        checkpoint,
    )
    register(
        "pipeline.logs",
        'A pipeline\'s log lines. Body: {"id", "after"?: seq}. Result: {"lines": [...]}.',
        logs,
    )
