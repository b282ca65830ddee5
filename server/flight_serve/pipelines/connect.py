"""The connector registry: one row per connector of a pipeline.

A row (:class:`ConnectorSpec`) says what a connector is to the runtime: its name, the roles it
plays (``source``, ``table``, ``sink``) with the ``WITH (…)`` options each role takes, and
whether a checkpointed run covers it exactly once. The runtime looks connectors up here and
names none itself; adding a connector is one module (its source or sink, built on the
contracts of :mod:`flight_serve.connectors.base`) plus one row in :data:`REGISTRY`.

Checks:

* :func:`connector_of` (building any run): the connector exists for the role, and every option
  is one it takes (the nearest known one is suggested);
* :func:`check_checkpointed` (a checkpointed run, ``flight-serve run`` with checkpoints or a
  server pipeline): every connector is exactly-once there; a refusal says what to do instead.

Errors: :class:`~flight_serve.errors.PipelineSQLError` with the line and column of the option.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from flight_serve.connectors.datagen import OPTION_ALIASES as DATAGEN_ALIASES
from flight_serve.connectors.datagen import SOURCE_OPTIONS as DATAGEN_OPTIONS
from flight_serve.connectors.falkordb import FALKORDB_OPTIONS
from flight_serve.pipelines.iceberg_io import SINK_OPTIONS as ICEBERG_SINK_OPTIONS
from flight_serve.pipelines.iceberg_io import SOURCE_OPTIONS as ICEBERG_SOURCE_OPTIONS
from flight_serve.pipelines.iceberg_io import is_catalog_option
from flight_serve.pipelines.pipeline import Option, PipelinePlan
from flight_serve.pipelines.query import did_you_mean

__all__ = [
    "CONNECTORS",
    "FLIGHT_AUTH_OPTIONS",
    "REGISTRY",
    "ConnectorSpec",
    "check_checkpointed",
    "connector_of",
]

#: Options of a ``flight`` connector with a ``server``: TLS trust and identity, bearer token.
FLIGHT_AUTH_OPTIONS: tuple[str, ...] = ("tls_ca", "tls_cert", "tls_key", "token_env")

#: ``(role, options, server pipeline) -> bool``: whether a checkpointed run covers it.
ExactlyOnce = Callable[[str, Mapping[str, Option], bool], bool]


def _always(role: str, options: Mapping[str, Option], server: bool) -> bool:
    return True


def _never(role: str, options: Mapping[str, Option], server: bool) -> bool:
    return False


def _datagen_option(key: str) -> bool:
    # fields.<column>.<option>, and Flink's and RisingWave's spellings (the connector checks them)
    return key.startswith("fields.") or key in DATAGEN_ALIASES


def _flight_exactly_once(role: str, options: Mapping[str, Option], server: bool) -> bool:
    # this server's streams (no server option, inside the server) or another Flight server's
    return server or "server" in options


@dataclass(frozen=True)
class ConnectorSpec:
    """One connector (see the module docstring).

    Attributes:
        name: what ``connector = '…'`` says.
        options: the options each role takes, by role (``source``, ``table``, ``sink``); the
            roles are its keys.
        exactly_once: whether a checkpointed run covers it in a role (its sources resume from
            their offsets, its sinks commit each epoch once).
        extra_option: options beyond :attr:`options` it also takes (Iceberg catalog
            properties).
    """

    name: str
    options: Mapping[str, tuple[str, ...]]
    exactly_once: ExactlyOnce = _never
    extra_option: Callable[[str], bool] | None = None
    roles: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", frozenset(self.options))

    def takes(self, role: str, key: str) -> bool:
        """Whether the connector in ``role`` takes option ``key``."""
        return key in self.options[role] or (
            self.extra_option is not None and self.extra_option(key)
        )


#: Every connector of a pipeline run, by name (the order is the one messages list them in).
REGISTRY: dict[str, ConnectorSpec] = {
    spec.name: spec
    for spec in (
        ConnectorSpec(
            "file",
            {
                "source": ("connector", "path", "format", "batch_rows", "delimiter"),
                "table": ("connector", "path", "format", "delimiter"),
                "sink": ("connector", "path", "format"),
            },
            exactly_once=_always,
        ),
        ConnectorSpec("stdout", {"sink": ("connector", "format")}, exactly_once=_always),
        # an epoch marker in the graph: exactly once anywhere
        ConnectorSpec("falkordb", {"sink": FALKORDB_OPTIONS}, exactly_once=_always),
        ConnectorSpec(
            "flight",
            {
                "source": (
                    "connector",
                    "server",
                    "stream",
                    "start_offset",
                    "stop_at_end",
                    "ticket",
                    "ticket_base64",
                    *FLIGHT_AUTH_OPTIONS,
                ),
                "sink": ("connector", "server", "stream", "writer", *FLIGHT_AUTH_OPTIONS),
            },
            exactly_once=_flight_exactly_once,
        ),
        ConnectorSpec(
            "iceberg",
            {"source": ICEBERG_SOURCE_OPTIONS, "sink": ICEBERG_SINK_OPTIONS},
            exactly_once=_always,
            extra_option=is_catalog_option,
        ),
        # its offsets are row counters: a restored run hands out the rows a straight run would
        ConnectorSpec(
            "datagen",
            {"source": DATAGEN_OPTIONS},
            exactly_once=_always,
            extra_option=_datagen_option,
        ),
    )
}

#: The options each connector takes, by role and name (the registry's view as a table).
CONNECTORS: dict[str, dict[str, tuple[str, ...]]] = {
    role: {name: spec.options[role] for name, spec in REGISTRY.items() if role in spec.roles}
    for role in ("source", "table", "sink")
}

#: Connectors of DESIGN §5 that only the server will run.
_SERVER_CONNECTORS = ("falkordb", "plugin")


def connector_of(options: Mapping[str, Option], role: str, what: str) -> ConnectorSpec:
    """The connector ``options`` name for ``role`` (``what``: e.g. ``SOURCE s``, for messages).

    Raises:
        PipelineSQLError: an unknown connector (the nearest name is suggested), one that cannot
            play the role in this run, or an option it does not take; at the option.
    """
    option = options["connector"]
    name = option.text.lower()
    available = CONNECTORS[role]
    if name not in available:
        if name in _SERVER_CONNECTORS or (role != "sink" and name == "stdout"):
            raise option.error(
                f"connector {name!r} cannot be a {role} of an embedded run; use "
                f"{' or '.join(repr(c) for c in available)}"
            )
        raise option.error(
            f"unknown connector {name!r} for a {role}{did_you_mean(name, list(available))} "
            f"(use {' or '.join(repr(c) for c in available)})"
        )
    spec = REGISTRY[name]
    for key, extra in options.items():
        if not spec.takes(role, key):
            raise extra.unknown(f"the {name} connector of {what}", available[name])
    return spec


def check_checkpointed(plan: PipelinePlan, *, server: bool) -> None:
    """Refuse a connector a checkpointed run cannot cover exactly once (``server``: a server
    pipeline, whose ``flight`` connectors without ``server`` are its own streams).

    Raises:
        PipelineSQLError: at the ``connector`` option, saying what to do instead.
    """
    for role, relations in (("source", plan.sources.values()), ("sink", plan.sinks.values())):
        for relation in relations:
            option = relation.connector["connector"]
            name = option.text.lower()
            spec = REGISTRY.get(name)
            if (
                spec is not None
                and role in spec.roles
                and spec.exactly_once(role, relation.connector, server)
            ):
                continue
            raise option.error(_refusal(name, role, server))


def _refusal(connector: str, role: str, server: bool) -> str:
    if server:
        return (
            f"a server pipeline takes file and iceberg sources and sinks, stdout and "
            f"falkordb sinks, this server's streams (connector 'flight' without a server "
            f"option) and other Flight servers' (connector 'flight' with a server option), "
            f"not a {connector!r} {role}"
        )
    return (
        f"a checkpointed run of flight-serve run covers file and iceberg sources, file, "
        f"stdout, iceberg and falkordb sinks, and flight connectors with a server option, "
        f"not a {connector!r} {role} (a "
        f"'flight' {role} needs server = …): submit the pipeline to the server "
        "(flight-serve submit), where it reads and writes streams exactly once, or run it "
        "without checkpoints"
    )
