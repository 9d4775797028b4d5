"""Unit tests of the task model: declaring tasks, running an attempt, and
the final event each outcome sends."""

import logging
import math
import threading
import time
import unittest

import taskhost_plugin as th
from taskhost_plugin.pb import plugin_pb2 as pb
from taskhost_plugin.plugin import Run, final_event

logging.getLogger().addHandler(logging.NullHandler())
quiet = logging.getLogger("test")
quiet.propagate = False
quiet.addHandler(logging.NullHandler())


def run(plugin, name, payload=b"{}", attempt=1, grace=0.1):
    req = pb.RunTaskRequest(task=name, payload_json=payload, message_id="7", attempt=attempt)
    return list(Run(plugin.tasks[name], req, {"k": "v"}, quiet, grace=grace).events())


class DeclareTest(unittest.TestCase):
    def test_plugin_name_rules(self):
        for bad in ["", "Upper", "1abc", "with-dash", "a" * 42]:
            with self.assertRaises(ValueError, msg=bad):
                th.Plugin(bad)
        self.assertEqual(th.Plugin("ok_name1").name, "ok_name1")

    def test_task_rules(self):
        p = th.Plugin("p")
        cases = [
            (dict(name=""), "the name is empty"),
            (dict(name=".dot"), "a name may hold only"),
            (dict(name="a b"), "a name may hold only"),
            (dict(name="x" * 201), "the limit is 200"),
            (dict(name="t", topic=" t"), "white space"),
            (dict(name="t", max_attempts=-1), "max_attempts"),
            (dict(name="t", max_attempts=1001), "max_attempts"),
            (dict(name="t", max_attempts=True), "max_attempts"),
            (dict(name="t", timeout=0), "timeout"),
            (dict(name="t", timeout=math.inf), "timeout"),
        ]
        for kw, want in cases:
            with self.assertRaises(ValueError, msg=kw) as cm:
                p.task(**kw)
            self.assertIn(want, str(cm.exception))

    def test_spec_and_duplicate(self):
        p = th.Plugin("p")

        @p.task("p.a", topic="images", max_attempts=5, timeout=2.5)
        def a(ctx, payload):
            """Resizes images.

            More text."""

        self.assertEqual(p.tasks["p.a"].spec(), pb.TaskSpec(name="p.a", topic="images", max_attempts=5, description="Resizes images.", timeout_seconds=2.5))
        with self.assertRaises(ValueError):
            p.task("p.a")

    def test_configure(self):
        p = th.Plugin("p")
        seen = []

        @p.on_configure
        def hook(cfg):
            seen.append(cfg)
            if cfg.get("color") not in (None, "red"):
                raise th.InvalidConfig("must be red", key="color")

        p.configure(b'{"color": "red"}')
        self.assertEqual(p.config, {"color": "red"})
        p.configure(b"")
        self.assertEqual(p.config, {})
        with self.assertRaises(th.InvalidConfig) as cm:
            p.configure(b'{"color": "blue"}')
        self.assertEqual(cm.exception.text(), "invalid config: color: must be red")
        with self.assertRaises(th.InvalidConfig) as cm:
            p.configure(b"{nope")
        self.assertIn("not JSON", cm.exception.text())


class FinalEventTest(unittest.TestCase):
    def test_results(self):
        self.assertEqual(final_event("t", result={"a": [1, "é"]}), pb.RunTaskEvent(done=True, result_json='{"a":[1,"é"]}'.encode()))
        self.assertEqual(final_event("t", result=None), pb.RunTaskEvent(done=True))
        self.assertEqual(final_event("t", result=th.RawJSON(b'{"x": 1}')), pb.RunTaskEvent(done=True, result_json=b'{"x": 1}'))
        ev = final_event("t", result={"s": {1}})
        self.assertEqual(ev.error, "task t returned a result that is not JSON: Object of type set is not JSON serializable")
        self.assertEqual(ev.outcome, pb.OUTCOME_ERROR)
        self.assertIn("not JSON", final_event("t", result=math.nan).error)

    def test_outcomes(self):
        ev = final_event("t", exc=th.Snooze(90))
        self.assertEqual((ev.done, ev.outcome, ev.snooze_seconds, ev.error), (True, pb.OUTCOME_SNOOZE, 90.0, "snoozed for 90 s"))
        ev = final_event("t", exc=th.Snooze(1.5, "waiting for the bucket"))
        self.assertEqual((ev.outcome, ev.snooze_seconds, ev.error), (pb.OUTCOME_SNOOZE, 1.5, "waiting for the bucket"))
        for bad in [-1, math.nan, math.inf, "soon", True, th.MAX_SNOOZE_SECONDS + 1]:
            ev = final_event("t", exc=th.Snooze(bad))
            self.assertEqual(ev.outcome, pb.OUTCOME_ERROR, bad)
            self.assertTrue(ev.error.startswith("task t: a snooze"), ev.error)
        ev = final_event("t", exc=th.Permanent("bad input"))
        self.assertEqual((ev.outcome, ev.error), (pb.OUTCOME_PERMANENT, "bad input"))
        ev = final_event("t", exc=th.CancelTask())
        self.assertEqual((ev.outcome, ev.error), (pb.OUTCOME_CANCEL, "cancelled by the task"))
        ev = final_event("t", exc=th.TaskError("nope"))
        self.assertEqual((ev.outcome, ev.error), (pb.OUTCOME_ERROR, "nope"))
        ev = final_event("t", exc=th.TaskError())
        self.assertEqual(ev.error, "task failed")
        ev = final_event("t", exc=ZeroDivisionError("division by zero"), logger=quiet)
        self.assertEqual((ev.outcome, ev.error), (pb.OUTCOME_ERROR, "ZeroDivisionError: division by zero"))
        # Every outcome but success carries an error, so an older host
        # never takes it for done.
        for exc in [th.Snooze(1), th.Permanent(""), th.CancelTask(""), th.TaskError(""), ValueError()]:
            self.assertTrue(final_event("t", exc=exc, logger=quiet).error, exc)


class RunTest(unittest.TestCase):
    def test_events_in_order(self):
        p = th.Plugin("p")

        @p.task("p.steps")
        def steps(ctx, payload):
            self.assertEqual((ctx.task, ctx.message_id, ctx.attempt, ctx.config), ("p.steps", "7", 2, {"k": "v"}))
            for i in range(payload["n"]):
                ctx.log("step %d" % i)
                ctx.progress((i + 1) / payload["n"])
            ctx.log("")  # dropped: an empty line is no log line
            ctx.progress(7)  # clamped
            return {"n": payload["n"]}

        evs = run(p, "p.steps", b'{"n": 2}', attempt=2)
        self.assertEqual(evs, [
            pb.RunTaskEvent(log_line="step 0"),
            pb.RunTaskEvent(progress=0.5, has_progress=True),
            pb.RunTaskEvent(log_line="step 1"),
            pb.RunTaskEvent(progress=1, has_progress=True),
            pb.RunTaskEvent(progress=1, has_progress=True),
            pb.RunTaskEvent(done=True, result_json=b'{"n":2}'),
        ])

    def test_payload_absent_or_bad(self):
        p = th.Plugin("p")
        got = []

        @p.task("p.t")
        def t(ctx, payload):
            got.append(payload)

        self.assertEqual(run(p, "p.t", b""), [pb.RunTaskEvent(done=True)])
        self.assertEqual(got, [None])
        evs = run(p, "p.t", b"{bad")
        self.assertIn("the payload is not JSON", evs[-1].error)

    def test_an_async_handler_in_one_call(self):
        p = th.Plugin("p")

        @p.task("p.aio")
        async def aio(ctx, payload):
            ctx.log("in a loop")
            return {"x": payload["x"]}

        self.assertEqual(run(p, "p.aio", b'{"x": 2}'), [pb.RunTaskEvent(log_line="in a loop"), pb.RunTaskEvent(done=True, result_json=b'{"x":2}')])

    def test_abort_ends_the_events_at_once(self):
        p = th.Plugin("p")
        release = threading.Event()

        @p.task("p.stuck")
        def stuck(ctx, payload):
            ctx.log("started")
            release.wait(30)  # ignores cancellation

        r = Run(p.tasks["p.stuck"], pb.RunTaskRequest(task="p.stuck"), {}, quiet)
        evs = r.events()
        self.assertEqual(next(evs), pb.RunTaskEvent(log_line="started"))
        r.abort()
        self.assertEqual(list(evs), [])
        self.assertTrue(r.ctx.cancelled)
        release.set()

    def test_timeout_abandons_the_handler(self):
        p = th.Plugin("p")
        seen = {}

        @p.task("p.slow", timeout=0.2)
        def slow(ctx, payload):
            seen["left"] = ctx.time_left()
            seen["cancelled"] = ctx.wait(30)
            ctx.log("too late")  # dropped: the attempt is over

        start = time.monotonic()
        evs = run(p, "p.slow")
        self.assertLess(time.monotonic() - start, 20)
        self.assertEqual(evs, [pb.RunTaskEvent(done=True, error="task p.slow timed out after 0.2 s")])
        for _ in range(100):
            if "cancelled" in seen:
                break
            time.sleep(0.05)
        self.assertTrue(seen["cancelled"], "the handler's context was not cancelled at its timeout")
        self.assertLessEqual(seen["left"], 0.2)


if __name__ == "__main__":
    unittest.main()
