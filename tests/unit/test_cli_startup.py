"""``flight-serve run`` / ``explain`` start with the cyclic garbage collector off (cold start,
DESIGN §11): ``cli._startup_gc``."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from flight_serve import cli


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()
    if was:
        gc.enable()
    else:
        gc.disable()


@pytest.mark.usefixtures("collector_on")
def test_collector_off_while_starting_then_frozen_then_restored() -> None:
    with cli._startup_gc() as started:
        assert not gc.isenabled()
        assert gc.get_freeze_count() == 0
        started()
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0
        started()  # a second call changes nothing
        assert gc.isenabled()
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


@pytest.mark.usefixtures("collector_on")
def test_collector_restored_when_the_start_fails() -> None:
    def start() -> None:
        with cli._startup_gc():
            assert not gc.isenabled()
            raise RuntimeError("bad pipeline")

    with pytest.raises(RuntimeError):
        start()
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


@pytest.mark.usefixtures("collector_on")
def test_a_collector_the_caller_turned_off_or_froze_is_left_alone() -> None:
    gc.disable()
    with cli._startup_gc() as started:
        started()
        assert not gc.isenabled()
        assert gc.get_freeze_count() == 0
    assert not gc.isenabled()
    gc.enable()
    gc.freeze()
    with cli._startup_gc() as started:
        assert gc.isenabled()
        started()
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0  # still frozen: not unfrozen on the way out
