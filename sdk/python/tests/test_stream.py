"""The stream of attempts (RunTasks) as the SDK serves it, driven in
process: the capacity first, events batched into frames, a final event
only once the handler has returned, cancels, overruns, hard_stop, the
workers, the drain; and RetryAfter and submits."""

import datetime
import json
import logging
import os
import queue
import threading
import time
import unittest

import grpc

import taskhost_plugin as th
from taskhost_plugin import runner as runner_mod
from taskhost_plugin import server
from taskhost_plugin.host import HostServices, submission
from taskhost_plugin.pb import plugin_pb2 as pb

quiet = logging.getLogger("test-stream")
quiet.propagate = False
quiet.setLevel(logging.DEBUG)


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)

    def messages(self):
        return [r.getMessage() for r in self.records]


class FakeContext:
    def __init__(self):
        self.callbacks = []

    def add_callback(self, fn):
        self.callbacks.append(fn)
        return True

    def end(self):
        for fn in self.callbacks:
            fn()


class Caller:
    """The caller's side of one stream: sends frames, reads what comes
    back on a thread of its own, and waits for final events."""

    def __init__(self, plugin, host=None, runner=None):
        plugin.logger = quiet
        self.records = Records()
        quiet.addHandler(self.records)
        self.runner = runner or runner_mod.Runner(plugin, quiet, lambda: host)
        self.q = queue.Queue()
        self.context = FakeContext()
        self.stream = runner_mod.TaskStream(self.runner, self._requests(), self.context)
        self.frames = []
        self.events = {}  # id -> [RunTaskEvent]
        self.cv = threading.Condition()
        self.next_id = 0
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _requests(self):
        while True:
            d = self.q.get()
            if d is None:
                return
            yield d

    def _read(self):
        for f in self.stream.frames():
            with self.cv:
                self.frames.append(f)
                for e in f.events:
                    self.events.setdefault(e.id, []).append(e.event)
                self.cv.notify_all()

    def send(self, *attempts, cancels=()):
        ids = []
        out = []
        for a in attempts:
            self.next_id += 1
            ids.append(self.next_id)
            out.append(pb.TaskAttempt(id=self.next_id, attempt=1, message_id=str(100 + self.next_id), **a))
        self.q.put(pb.TaskDispatch(attempts=out, cancels=[pb.TaskCancel(id=i, reason=r) for i, r in cancels]))
        return ids

    def cancel(self, aid, reason="timed out"):
        self.q.put(pb.TaskDispatch(cancels=[pb.TaskCancel(id=aid, reason=reason)]))

    def final(self, aid, timeout=30):
        with self.cv:
            ok = self.cv.wait_for(lambda: any(e.done for e in self.events.get(aid, [])), timeout)
            if not ok:
                raise AssertionError("no final event for attempt %d within %s s" % (aid, timeout))
            return [e for e in self.events[aid] if e.done][0]

    def has_final(self, aid):
        with self.cv:
            return any(e.done for e in self.events.get(aid, []))

    def close(self):
        self.q.put(None)
        self._t.join(30)
        quiet.removeHandler(self.records)


def wait_until(cond, timeout=30):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met within %s s" % timeout)
        time.sleep(0.01)


class StreamTest(unittest.TestCase):
    def caller(self, plugin, host=None):
        c = Caller(plugin, host)
        self.addCleanup(c.close)
        return c

    def test_capacity_first_then_results(self):
        p = th.Plugin("p", max_tasks=7)

        @p.task("p.echo")
        def echo(ctx, payload):
            ctx.log("hello")
            ctx.progress(2)
            return {"got": payload, "message_id": ctx.message_id, "headers": ctx.headers}

        @p.task("p.none")
        def none(ctx, payload):
            return None

        c = self.caller(p)
        a, b, n = c.send({"task": "p.echo", "payload_json": b'{"x": 1}', "headers": {"parent_task_id": "9"}},
                         {"task": "p.missing"}, {"task": "p.none"})
        fin = c.final(a)
        self.assertEqual(c.frames[0], pb.TaskReturn(capacity=7))
        self.assertEqual(json.loads(fin.result_json), {"got": {"x": 1}, "message_id": str(100 + a), "headers": {"parent_task_id": "9"}})
        # The log line and the progress (clamped) come before the final event.
        self.assertEqual(c.events[a][:2], [pb.RunTaskEvent(log_line="hello"), pb.RunTaskEvent(progress=1.0, has_progress=True)])
        self.assertEqual(c.final(b).error, "plugin p has no task 'p.missing'")
        self.assertEqual(c.final(n), pb.RunTaskEvent(done=True))

    def test_many_attempts_are_batched_and_bounded_by_workers(self):
        p = th.Plugin("p", max_tasks=4)
        running, most = [0], [0]
        lock = threading.Lock()

        @p.task("p.work")
        def work(ctx, payload):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.002)
            with lock:
                running[0] -= 1
            return payload["i"]

        c = self.caller(p)
        ids = c.send(*[{"task": "p.work", "payload_json": json.dumps({"i": i}).encode()} for i in range(200)])
        for i, aid in enumerate(ids):
            self.assertEqual(c.final(aid).result_json, str(i).encode())
        self.assertLessEqual(most[0], 4)
        self.assertLessEqual(c.runner.workers.threads, 4)

    def test_events_of_attempts_that_come_one_a_frame_are_held_together(self):
        old = runner_mod.LINGER
        runner_mod.LINGER = 0.3
        self.addCleanup(setattr, runner_mod, "LINGER", old)
        p = th.Plugin("p")

        @p.task("p.quick")
        def quick(ctx, payload):
            return None

        c = self.caller(p)
        ids = [c.send({"task": "p.quick"})[0] for _ in range(40)]
        for aid in ids:
            c.final(aid)
        # The capacity, the first event at once, then frames each holding
        # what came within 0.3 s.
        self.assertLessEqual(len(c.frames), 10, [len(f.events) for f in c.frames])

    def test_blocking_attempts_get_a_thread_each(self):
        p = th.Plugin("p", max_tasks=16)
        started = []
        release = threading.Event()

        @p.task("p.block")
        def block(ctx, payload):
            started.append(1)
            release.wait(60)

        @p.task("p.quick")
        def quick(ctx, payload):
            return None

        c = self.caller(p)
        ids = c.send(*[{"task": "p.block"}] * 16)
        wait_until(lambda: len(started) == 16)
        self.assertEqual(c.runner.workers.threads, 16)
        release.set()
        for aid in ids:
            c.final(aid)
        # Quick attempts afterwards reuse the threads.
        for aid in c.send(*[{"task": "p.quick"}] * 100):
            c.final(aid)
        self.assertEqual(c.runner.workers.threads, 16)

    def test_quick_attempts_keep_few_threads(self):
        p = th.Plugin("p", max_tasks=64)

        @p.task("p.quick")
        def quick(ctx, payload):
            return None

        c = self.caller(p)
        for _ in range(5):
            for aid in c.send(*[{"task": "p.quick"}] * 50):
                c.final(aid)
        # Some may be started on a loaded machine, never one per attempt.
        self.assertLess(c.runner.workers.threads, 64)

    def test_a_cancel_waits_for_the_handler(self):
        p = th.Plugin("p")
        release = threading.Event()
        seen = {}

        @p.task("p.stubborn", timeout=60)
        def stubborn(ctx, payload):
            seen["deadline"] = ctx.time_left()
            ctx.log("started")
            release.wait(60)  # ignores its cancel
            seen["cancelled"] = ctx.cancelled
            return {"late": True}

        @p.task("p.polite")
        def polite(ctx, payload):
            ctx.log("started")
            if ctx.wait(60):
                raise th.TaskError("stopped: cancelled")
            return {"late": True}

        c = self.caller(p)
        s, po = c.send({"task": "p.stubborn", "timeout_seconds": 5}, {"task": "p.polite"})
        wait_until(lambda: len(c.events.get(s, [])) == 1 and len(c.events.get(po, [])) == 1)
        self.assertLessEqual(seen["deadline"], 5)  # the attempt's timeout, not the task's
        c.cancel(s)
        c.cancel(po, "cancelled by an operator")
        self.assertEqual(c.final(po).error, "stopped: cancelled")
        time.sleep(0.2)
        self.assertFalse(c.has_final(s), "a final event was sent while the handler still ran")
        self.assertEqual(c.runner.stats()["running"], 1)
        release.set()
        self.assertEqual(json.loads(c.final(s).result_json), {"late": True})
        self.assertTrue(seen["cancelled"])

    def test_an_overrun_is_logged_and_counted(self):
        old = runner_mod.OVERRUN_AFTER
        runner_mod.OVERRUN_AFTER = 0.05
        self.addCleanup(setattr, runner_mod, "OVERRUN_AFTER", old)
        p = th.Plugin("p")
        release = threading.Event()

        @p.task("p.stubborn")
        def stubborn(ctx, payload):
            ctx.log("started")
            release.wait(60)

        c = self.caller(p)
        (s,) = c.send({"task": "p.stubborn"})
        wait_until(lambda: c.events.get(s))
        c.cancel(s, "timed out after 1s")
        wait_until(lambda: c.runner.stats()["overrunning"] == 1)
        self.assertIn("task handlers running past their cancel: 1 now, 1 since start", c.runner.health_message())
        warn = [r for r in c.records.records if r.levelno == logging.WARNING and "runs on past its cancel" in r.getMessage()]
        self.assertEqual(len(warn), 1)
        self.assertEqual((warn[0].task, warn[0].reason), ("p.stubborn", "timed out after 1s"))
        release.set()
        self.assertEqual(c.final(s), pb.RunTaskEvent(done=True))
        st = c.runner.stats()
        self.assertEqual((st["overrunning"], st["overruns"]), (0, 1))
        wait_until(lambda: any("returned after its cancel" in m for m in c.records.messages()))

    def test_a_log_flood_is_bounded(self):
        old = runner_mod.MAX_QUEUED_EVENTS
        runner_mod.MAX_QUEUED_EVENTS = 10
        self.addCleanup(setattr, runner_mod, "MAX_QUEUED_EVENTS", old)
        p = th.Plugin("p")

        @p.task("p.flood")
        def flood(ctx, payload):
            for i in range(100):
                ctx.log("line %d" % i)
            return None

        c = self.caller(p)
        wait_until(lambda: c.frames)  # the capacity
        # The caller reads nothing meanwhile: the events wait.
        with c.cv:
            (a,) = c.send({"task": "p.flood"})
            wait_until(lambda: c.stream._dropped or not c.stream.running)
        c.final(a)
        lines = [e.log_line for e in c.events[a] if e.log_line]
        self.assertLess(len(lines), 100)
        self.assertRegex(lines[-1], r"^\(\d+ log lines dropped: the task logged faster than they could be sent\)$")

    def test_a_cancel_before_the_start(self):
        p = th.Plugin("p", max_tasks=1)
        release = threading.Event()

        @p.task("p.block")
        def block(ctx, payload):
            release.wait(60)

        c = self.caller(p)
        first, second = c.send({"task": "p.block"}, {"task": "p.block"})
        wait_until(lambda: c.runner.workers.threads == 1)
        c.cancel(second, "cancelled by an operator")
        time.sleep(0.1)
        release.set()
        self.assertIn("was cancelled before it started: cancelled by an operator", c.final(second).error)
        self.assertEqual(c.final(first), pb.RunTaskEvent(done=True))

    def test_the_end_of_the_stream_cancels_what_runs(self):
        p = th.Plugin("p")
        seen = threading.Event()

        @p.task("p.wait")
        def wait(ctx, payload):
            ctx.log("started")
            if ctx.wait(60):
                seen.set()

        c = self.caller(p)
        (a,) = c.send({"task": "p.wait"})
        wait_until(lambda: c.events.get(a))
        c.q.put(None)
        self.assertTrue(seen.wait(30))
        wait_until(lambda: c.runner.stats()["running"] == 0 and not c.runner.streams)

    def test_outcomes(self):
        p = th.Plugin("p")

        @p.task("p.retry")
        def retry(ctx, payload):
            raise th.RetryAfter(payload["s"], "rate limited")

        @p.task("p.snooze")
        def snooze(ctx, payload):
            raise th.Snooze(5)

        c = self.caller(p)
        r, bad, sn = c.send({"task": "p.retry", "payload_json": b'{"s": 30}'}, {"task": "p.retry", "payload_json": b'{"s": -1}'},
                            {"task": "p.snooze"})
        self.assertEqual(c.final(r), pb.RunTaskEvent(done=True, error="rate limited", retry_after_seconds=30))
        self.assertEqual(c.final(bad).error, "task p.retry: a retry delay of -1 s is not valid: give a number of seconds from 0 to 31536000")
        self.assertEqual(c.final(sn).outcome, pb.OUTCOME_SNOOZE)


class AsyncTest(unittest.TestCase):
    def caller(self, plugin, host=None):
        c = Caller(plugin, host)
        self.addCleanup(c.close)
        return c

    def test_async_handlers_run_on_one_loop(self):
        import asyncio

        p = th.Plugin("p", max_tasks=50)
        threads = set()
        running, most = [0], [0]

        @p.task("p.aio")
        async def aio(ctx, payload):
            threads.add(threading.get_ident())
            running[0] += 1
            most[0] = max(most[0], running[0])
            ctx.log("sleeping")
            await asyncio.sleep(0.2)
            running[0] -= 1
            if payload.get("fail"):
                raise th.RetryAfter(5, "later")
            return {"i": payload["i"]}

        c = self.caller(p)
        ids = c.send(*[{"task": "p.aio", "payload_json": json.dumps({"i": i, "fail": i == 0}).encode()} for i in range(40)])
        self.assertEqual(c.final(ids[0]), pb.RunTaskEvent(done=True, error="later", retry_after_seconds=5))
        for i, aid in enumerate(ids[1:], 1):
            self.assertEqual(json.loads(c.final(aid).result_json), {"i": i})
        self.assertEqual(len(threads), 1)
        self.assertEqual(most[0], 40)  # all at once, on one thread
        self.assertEqual(c.runner.workers.threads, 0)

    def test_a_cancel_raises_in_the_coroutine_and_waits_for_its_end(self):
        import asyncio

        p = th.Plugin("p")
        cleaned = threading.Event()

        @p.task("p.aio")
        async def aio(ctx, payload):
            ctx.log("started")
            try:
                await asyncio.sleep(60)
            finally:
                await asyncio.sleep(0.2)  # cleans up after the cancel
                cleaned.set()

        c = self.caller(p)
        (a,) = c.send({"task": "p.aio"})
        wait_until(lambda: c.events.get(a))
        c.cancel(a, "timed out after 1s")
        fin = c.final(a)
        self.assertTrue(cleaned.is_set(), "the final event came before the coroutine ended")
        self.assertEqual(fin.error, "task p.aio was cancelled: timed out after 1s")

    def test_hard_stop_is_for_plain_functions(self):
        p = th.Plugin("p")
        with self.assertRaises(ValueError):
            @p.task("p.aio", hard_stop=True)
            async def aio(ctx, payload):
                pass


class HardStopTest(unittest.TestCase):
    def caller(self, plugin, host=None):
        c = Caller(plugin, host)
        self.addCleanup(c.close)
        return c

    def test_a_handler_that_ignores_its_cancel_is_killed(self):
        p = th.Plugin("p")

        @p.task("p.hang", hard_stop=0.2)
        def hang(ctx, payload):
            ctx.log("pid %d" % os.getpid())
            time.sleep(3600)

        c = self.caller(p)
        (a,) = c.send({"task": "p.hang"})
        wait_until(lambda: c.events.get(a))
        pid = int(c.events[a][0].log_line.split()[1])
        self.assertNotEqual(pid, os.getpid())
        start = time.monotonic()
        c.cancel(a, "timed out after 1s")
        fin = c.final(a)
        self.assertLess(time.monotonic() - start, 20)
        self.assertRegex(fin.error, r"^task p\.hang was killed \d+\.\d s after its cancel \(hard_stop\): timed out after 1s$")
        self.assertEqual(c.runner.stats()["killed"], 1)
        self.assertFalse(os.path.exists("/proc/%d" % pid) and open("/proc/%d/stat" % pid).read().split(")")[1].split()[0] != "Z")

    def test_a_handler_in_its_process_reports_and_returns(self):
        p = th.Plugin("p")
        calls = []

        class Host:
            def submit_tasks(self, tasks, parent_task_id="", timeout=30):
                calls.append((tasks, parent_task_id))
                return [th.SubmittedTask("42", False)]

        @p.task("p.child", hard_stop=True)
        def child(ctx, payload):
            ctx.log("in %d" % os.getpid())
            ctx.progress(0.5)
            sub = ctx.submit("p.other", {"n": 1})
            if ctx.wait(0.01):
                raise th.TaskError("cancelled")
            if payload.get("fail"):
                raise th.Permanent("no")
            return {"pid": os.getpid(), "child": sub.id}

        c = self.caller(p, Host())
        ok, bad = c.send({"task": "p.child", "payload_json": b"{}"}, {"task": "p.child", "payload_json": b'{"fail": true}'})
        res = json.loads(c.final(ok).result_json)
        self.assertNotEqual(res["pid"], os.getpid())
        self.assertEqual(res["child"], "42")
        evs = c.events[ok]
        self.assertEqual(evs[0].log_line, "in %d" % res["pid"])
        self.assertEqual(evs[1], pb.RunTaskEvent(progress=0.5, has_progress=True))
        self.assertEqual(sorted(parent for _, parent in calls), [str(100 + ok), str(100 + bad)])
        self.assertEqual(calls[0][0][0]["task"], "p.other")
        self.assertEqual(c.final(bad), pb.RunTaskEvent(done=True, error="no", outcome=pb.OUTCOME_PERMANENT))

    def test_a_polite_handler_returns_within_its_grace(self):
        p = th.Plugin("p")

        @p.task("p.polite", hard_stop=30)
        def polite(ctx, payload):
            ctx.log("started")
            if ctx.wait(60):
                raise th.TaskError("stopped at the cancel")

        c = self.caller(p)
        (a,) = c.send({"task": "p.polite"})
        wait_until(lambda: c.events.get(a))
        c.cancel(a)
        self.assertEqual(c.final(a).error, "stopped at the cancel")
        self.assertEqual(c.runner.stats()["killed"], 0)


class DrainTest(unittest.TestCase):
    def test_stop_waits_for_running_attempts_then_cancels(self):
        p = th.Plugin("p")
        release = threading.Event()
        cancelled = threading.Event()

        @p.task("p.quick")
        def quick(ctx, payload):
            release.wait(60)
            return {"ok": True}

        @p.task("p.long")
        def long(ctx, payload):
            if ctx.wait(60):
                cancelled.set()

        st = server.State(p, quiet)
        c = Caller(p, runner=st.runner)
        self.addCleanup(c.close)
        q, lg = c.send({"task": "p.quick"}, {"task": "p.long"})
        wait_until(lambda: st.runner.running() == 2)
        threading.Timer(0.2, release.set).start()
        start = time.monotonic()
        self.assertFalse(st.drain(1.0))
        self.assertGreaterEqual(time.monotonic() - start, 0.9)
        self.assertEqual(json.loads(c.final(q).result_json), {"ok": True})
        self.assertTrue(cancelled.wait(30))
        c.final(lg)
        # New attempts are refused while it stops.
        (n,) = c.send({"task": "p.quick"})
        self.assertEqual(c.final(n).error, "plugin p is stopping")


class SubmitTest(unittest.TestCase):
    class Stub:
        def __init__(self, error=None):
            self.requests = []
            self.error = error

        def SubmitTasks(self, req, timeout=None):
            self.requests.append(req)
            if self.error is not None:
                raise self.error
            return pb.SubmitTasksResponse(tasks=[pb.SubmittedTask(id=str(10 + i), duplicate=i == 1) for i in range(len(req.tasks))])

    class RpcError(grpc.RpcError):
        def __init__(self, code, details):
            self._code, self._details = code, details

        def code(self):
            return self._code

        def details(self):
            return self._details

    def host(self, stub):
        h = HostServices(lambda timeout: None)
        h._stub = stub
        return h

    def test_ctx_submit_names_its_parent(self):
        stub = self.Stub()
        ctx = th.TaskContext("p.t", b"", "77", 1, {}, quiet, None, host=self.host(stub))
        at = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
        got = ctx.submit("p.child", {"a": [1]}, topic="t", run_at=at, max_attempts=2, priority=3, unique_key="k",
                         unique_for=datetime.timedelta(minutes=1))
        self.assertEqual(got, th.SubmittedTask("10", False))
        self.assertEqual(stub.requests[0].tasks[0], pb.TaskSubmission(
            task="p.child", topic="t", payload_json=b'{"a":[1]}', run_at="2030-01-02T03:04:05Z", max_attempts=2, priority=3,
            unique_key="k", unique_key_set=True, unique_for_seconds=60, parent_task_id="77"))
        many = ctx.submit_many([{"task": "a"}, {"task": "b", "delay": 5, "payload": th.RawJSON(b"[1]")}])
        self.assertEqual(many, [th.SubmittedTask("10", False), th.SubmittedTask("11", True)])
        self.assertEqual(stub.requests[1].tasks[1], pb.TaskSubmission(task="b", payload_json=b"[1]", delay_seconds=5, parent_task_id="77"))

    def test_bad_submits_are_refused_before_sending(self):
        stub = self.Stub()
        h = self.host(stub)
        for tasks, want in [
            ([{"task": ""}], "task 1 to submit (): the task's name must be a non-empty string"),
            ([{"task": "a", "delay": 1, "run_at": "2030-01-01T00:00:00Z"}], "give a delay or a run_at, not both"),
            ([{"task": "a", "delay": -1}], "delay must be a number of seconds"),
            ([{"task": "a", "payload": {1, 2}}], "the payload is not JSON"),
            ([{"task": "a", "run_at": datetime.datetime(2030, 1, 1)}], "timezone-aware"),
            ([{"task": "a", "colour": "red"}], "unknown keys colour"),
            ({"task": "a"}, "a list of tasks"),
        ]:
            with self.assertRaises(ValueError) as cm:
                h.submit_tasks(tasks)
            self.assertIn(want, str(cm.exception))
        self.assertEqual(stub.requests, [])
        with self.assertRaises(ValueError):
            submission("a", priority=1.5)

    def test_refusals_and_unavailable(self):
        h = self.host(self.Stub(self.RpcError(grpc.StatusCode.INVALID_ARGUMENT, "task 1 (nope): unknown task")))
        with self.assertRaises(th.SubmitRefused) as cm:
            h.submit_tasks([{"task": "nope"}])
        self.assertEqual(str(cm.exception), "submit refused: task 1 (nope): unknown task")
        self.assertIsInstance(cm.exception, th.TaskError)
        self.assertIsInstance(cm.exception, ValueError)
        h = self.host(self.Stub(self.RpcError(grpc.StatusCode.UNAVAILABLE, "tasks_worker is not running")))
        with self.assertRaises(th.HostUnavailable) as cm:
            h.submit_tasks([{"task": "a"}])
        self.assertIn("tasks_worker is not running", str(cm.exception))
        ctx = th.TaskContext("p.t", b"", "1", 1, {}, quiet, None)
        with self.assertRaises(th.HostUnavailable):
            ctx.submit("a")


if __name__ == "__main__":
    unittest.main()
