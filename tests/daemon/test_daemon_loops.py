"""Loops driven with a fast clock: each wait records its delay and returns at once."""
import random
import threading

from core_helpers import install_agent, make_parts
from fault_helpers import API

from caldera.daemon import sender
from caldera.protocol.retry import Backoff


class RecordingEvent(threading.Event):
    """An Event whose wait() records the delay and returns at once (a fast clock)."""

    def __init__(self, stop_after, stop):
        super().__init__()
        self.delays, self.stop_after, self._stop = [], stop_after, stop

    def wait(self, timeout=None):
        self.delays.append(timeout)
        if len(self.delays) >= self.stop_after:
            self._stop.set()
        return False


def test_backoff_schedule_with_jitter_bounds():
    backoff = Backoff(rng=random.Random(1))
    delays = [backoff.next_delay() for _ in range(8)]
    for delay, base in zip(delays, (1, 2, 5, 10, 30, 60, 60, 60), strict=True):
        assert base * 0.8 <= delay <= base * 1.2
    assert backoff.next_delay(retry_after=300) == 300  # Retry-After is a floor
    backoff.reset()
    assert backoff.next_delay() <= 1.2


def test_sender_backs_off_through_an_outage_then_delivers_everything(caldera_env, wire):
    install_agent(caldera_env, base_url=wire.url)
    rt = make_parts(with_driver=False)
    wire.route("POST", API + "/register", json={"success": True, "data": {"session_token": "agt_sess_x1234567"}})
    for i in range(3):
        rt.outbox.put("finish", {"command_id": i, "body": {"status": "succeeded"}})
    outage = {"left": 7}

    def finish(request):
        if outage["left"] > 0:
            outage["left"] -= 1
            return 503, {}, '{"success":false,"error":"down"}'
        return 200, {}, '{"success":true}'

    wire.route("POST", __import__("re").compile(API + r"/commands/\d+/finish$"), callback=finish)
    rt.outbox.wakeup = RecordingEvent(stop_after=12, stop=rt.wake.stop)
    sender.sender_loop(rt.client, rt.outbox, rt.wake, rt.live, rt.redactor)
    delays = rt.outbox.wakeup.delays
    bases = (1, 2, 5, 10, 30, 60, 60)
    for delay, base in zip(delays[:len(bases)], bases, strict=True):
        assert base * 0.8 <= delay <= base * 1.2
    assert delays[len(bases)] == sender.IDLE_WAIT  # delivered: back to idle
    assert rt.outbox.depth() == 0
    delivered = [c.path for c in wire.seen("finish") if c.status == 200]
    assert [u.rsplit("/", 2)[-2] for u in delivered] == ["0", "1", "2"]  # in order, each once
    rt.pool.shutdown(wait=False)


def test_sender_moves_permanently_refused_items_aside(caldera_env, wire):
    install_agent(caldera_env, base_url=wire.url)
    rt = make_parts(with_driver=False)
    wire.route("POST", API + "/register", json={"success": True, "data": {"session_token": "agt_sess_x1234567"}})
    wire.route("POST", API + "/commands/1/finish", status=400,
               json={"success": False, "error": "status must be succeeded or failed"})
    wire.route("POST", API + "/commands/2/finish", json={"success": True})
    rt.outbox.put("finish", {"command_id": 1, "body": {}})
    rt.outbox.put("finish", {"command_id": 2, "body": {}})
    assert sender.flush(rt.client, rt.outbox, rt.wake.stop) is True
    assert len(list((rt.outbox.dir / "rejected").glob("*.json"))) == 1
    assert "status must be" in next((rt.outbox.dir / "rejected").glob("*.reason")).read_text()
    tries = wire.seen(r"/commands/1/finish$")
    assert len(tries) == 2  # as queued, then cut to what the server accepts
    assert tries[1].json()["result"]["cut"] is True
    rt.pool.shutdown(wait=False)


def test_redacting_log_filter_masks_canaries(caldera_env, capsys):
    import io
    import logging

    from core_helpers import BOOT, SECRET

    from caldera.host import logsetup
    from caldera.redact import Redactor

    stream = io.StringIO()
    root = logging.getLogger("caldera")
    saved = (list(root.handlers), root.level, root.propagate)
    handler = logsetup.setup("debug", Redactor([BOOT, SECRET]), stream=stream)
    log = logging.getLogger("caldera.test")
    log.debug("token %s and %s", BOOT, {"Authorization": f"Bearer {SECRET}"})
    try:
        raise RuntimeError(f"failed with {SECRET}")
    except RuntimeError:
        log.exception("boom")
    root.removeHandler(handler)
    root.handlers[:], root.level, root.propagate = saved  # leave logging as other tests expect it
    text = stream.getvalue()
    assert BOOT not in text and SECRET not in text and "[REDACTED]" in text and "RuntimeError" in text
