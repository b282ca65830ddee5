"""Each input partition's own watermark, as status pages show it
(:meth:`WatermarkTracker.partition_watermarks`, ``WindowOperator.partition_watermarks``)."""

from __future__ import annotations

from flight_serve.engine.watermark import WatermarkTracker
from flight_serve.types import MAX_WATERMARK_NS, MIN_WATERMARK_NS


def test_each_partition_has_its_own_watermark_idle_and_ended() -> None:
    now = [0]
    w = WatermarkTracker(max_out_of_orderness_ns=5, idle_timeout_ns=100, clock_ns=lambda: now[0])
    w.add_partition("waiting")
    w.observe("fast", 1_000)
    w.observe("slow", 400)
    w.observe("done", 50)
    w.finish("done")
    w.advance("slow", 700)  # an explicit marker above what its rows say
    now[0] = 50
    w.observe("fast", 1_200)
    now[0] = 120  # "waiting" and "slow" were last active at 0: idle; "fast" at 50
    assert w.partition_watermarks() == {
        "waiting": {"watermark_ns": None, "idle": True, "finished": False},
        "fast": {"watermark_ns": 1_195, "idle": False, "finished": False},
        "slow": {"watermark_ns": 700, "idle": True, "finished": False},
        "done": {"watermark_ns": MAX_WATERMARK_NS, "idle": False, "finished": True},
    }
    assert w.watermark_ns == MIN_WATERMARK_NS  # "waiting" held it back until it went idle
    assert w.refresh() == 1_195  # the idle ones no longer hold it back
