"""Running attempts: the stream of attempts (TaskProvider.RunTasks), the
threads that run the handlers, and what happens after a cancel.

One RunTasks stream carries many attempts. Per stream, one thread (the
reader) reads the caller's frames and queues each attempt, and the
stream's response generator (the writer) sends, in one frame, every event
that is ready when it wakes. The handlers run on the plugin's workers: at
most max_tasks threads, started as attempts need them and kept, taking
attempts from one queue; no thread is started per attempt.

An attempt's final event is sent only once its handler has returned (or,
for a hard_stop task, its process has been killed): until then the
caller counts it as running, in the provider's capacity and in its
topic's concurrency limit. A cancel (a timeout, an operator's cancel, the
stream's end) only sets ctx.cancelled; a handler still running
OVERRUN_AFTER seconds later is logged once and counted as overrunning
until it returns.
"""

import collections
import heapq
import json
import threading
import time

from . import errors
from .pb import plugin_pb2 as pb
from .plugin import TaskContext, final_event

# A handler still running this long after its attempt's cancel overruns:
# it is logged (once) and counted, and it keeps its place until it returns.
OVERRUN_AFTER = 1.0

_DONE = pb.RunTaskEvent(done=True)

# Log and progress events waiting to be sent past which more are dropped
# (final events never are), as in the Go SDK.
MAX_QUEUED_EVENTS = 4096

# A frame costs Python's gRPC far more than the events in it. While the
# caller sends few attempts a frame (under SMALL_FRAME on average) and
# frames go out often (the last one less than BUSY seconds ago), the
# writer holds events LINGER seconds before it sends them, so that one
# frame carries many. Attempts that come many a frame end together and
# go at once; so does an event after a quiet moment.
LINGER = 0.002
BUSY = 0.005
SMALL_FRAME = 4


class Timers:
    """Calls functions at given times (time.monotonic()), on one thread
    started on first use. A call must be quick: it runs on that thread."""

    def __init__(self, name="timers"):
        self._name = name
        self._cv = threading.Condition(threading.Lock())
        self._heap = []
        self._seq = 0
        self._thread = None

    def at(self, when, fn, *args):
        with self._cv:
            self._seq += 1
            heapq.heappush(self._heap, (when, self._seq, fn, args))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cv.notify()

    def _loop(self):
        while True:
            with self._cv:
                while True:
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        _, _, fn, args = heapq.heappop(self._heap)
                        break
                    self._cv.wait(None if not self._heap else self._heap[0][0] - now)
            try:
                fn(*args)
            except Exception:  # a timer's failure must not stop the others
                import logging

                logging.getLogger(__name__).exception("a timer failed")


class Workers:
    """At most n threads that run attempts from one queue, started as
    they are needed and then kept.

    A put wakes (or starts) one thread. Quick attempts are best run by
    that one: more threads only contend for the GIL. But a handler may
    block, so while the queue is not empty a check every STALL seconds
    wakes more threads, twice as many each time (1, 2, 4...), until the
    queue is empty or n threads run: attempts that block get a thread
    each within a few checks."""

    STALL = 0.001

    def __init__(self, n, run, timers, name="task"):
        self.n = n
        self._run = run
        self._timers = timers
        self._name = name
        self._q = collections.deque()
        self._cv = threading.Condition(threading.Lock())
        self._idle = 0  # threads waiting, not yet woken
        self._checking = False  # a check is due
        self._boost = 1  # threads the next check wakes
        self.threads = 0

    def put(self, items):
        self._q.extend(items)
        check = False
        with self._cv:
            start = self._wake(1)
            if not self._checking:
                self._checking = check = True
        self._start(start)
        if check:
            self._timers.at(time.monotonic() + self.STALL, self._check)

    def _wake(self, k):
        """Wakes up to k idle threads; returns how many to start besides
        (self._cv is held)."""
        wake = min(k, self._idle)
        if wake:
            self._idle -= wake
            self._cv.notify(wake)
        start = max(0, min(k - wake, self.n - self.threads))
        self.threads += start
        return start

    def _start(self, k):
        for _ in range(k):
            threading.Thread(target=self._loop, name=self._name, daemon=True).start()

    def _check(self):
        with self._cv:
            left = len(self._q)
            if not left:
                self._checking = False
                self._boost = 1
                return
            start = self._wake(min(left, self._boost))
            self._boost = min(self._boost * 2, self.n)
        self._start(start)
        self._timers.at(time.monotonic() + self.STALL, self._check)

    def _loop(self):
        q, run, cv = self._q, self._run, self._cv
        while True:
            try:
                item = q.popleft()
            except IndexError:
                with cv:
                    if not q:
                        self._idle += 1
                        cv.wait()
                continue
            run(item)


class Attempt:
    """One attempt in the plugin: its task, its context, and when it was
    cancelled."""

    __slots__ = ("id", "task", "ctx", "owner", "cancelled_at", "reason", "started", "ended", "overran", "proc", "aio")

    def __init__(self, aid, task, ctx, owner):
        self.id = aid
        self.task = task
        self.ctx = ctx
        self.owner = owner  # the TaskStream it came on
        self.cancelled_at = None
        self.reason = ""
        self.started = False
        self.ended = False
        self.overran = False
        self.proc = None  # the child process of a hard_stop attempt
        self.aio = None  # the asyncio task of an async def's attempt (used on the loop only)


class Runner:
    """The plugin's side of running attempts, shared by its streams: the
    workers, the timers, and the counts of what runs."""

    def __init__(self, plugin, logger, host_services=lambda: None):
        self.plugin = plugin
        self.logger = logger
        self.host_services = host_services
        self.lock = threading.Lock()
        self.timers = Timers()
        self.workers = Workers(max(1, plugin.max_tasks), self._run, self.timers)
        self._loop = None  # the event loop of async def handlers, started on first use
        self.streams = set()
        self.overrunning = 0  # handlers running past OVERRUN_AFTER after their cancel
        self.overruns = 0  # such handlers since the start
        self.killed = 0  # hard_stop processes killed after their cancel
        self.stopping = False

    # --- counts

    def running(self):
        """How many attempts of streams have not ended (queued or running)."""
        with self.lock:
            streams = list(self.streams)
        return sum(len(s.running) for s in streams)

    def pending(self):
        """Attempts not ended, and events of open streams not sent yet:
        what a drain waits for."""
        with self.lock:
            streams = list(self.streams)
        return sum(len(s.running) + (0 if s.closed else len(s.out)) for s in streams)

    def stats(self):
        with self.lock:
            streams = list(self.streams)
            return {
                "streams": sum(1 for s in streams if not s.closed),
                "running": sum(len(s.running) for s in streams),
                "overrunning": self.overrunning,
                "overruns": self.overruns,
                "killed": self.killed,
            }

    # --- cancels and overruns

    def cancel(self, att, reason):
        """Tells att's handler to stop; its place stays held until it
        returns. Called once per attempt at most (later calls do nothing)."""
        if att.cancelled_at is not None or att.ended:
            return
        att.cancelled_at = time.monotonic()
        att.reason = reason or "cancelled"
        att.ctx.cancel()
        if att.proc is not None:  # a hard_stop child: its own context
            att.proc.cancel(att.reason)
        if att.task.is_async and self._loop is not None:
            self._loop.call_soon_threadsafe(_cancel_coroutine, att)
        self.timers.at(att.cancelled_at + OVERRUN_AFTER, self._check_overrun, att)
        if att.task.hard_stop is not None:
            self.timers.at(att.cancelled_at + att.task.hard_stop, self._hard_stop, att)

    def _check_overrun(self, att):
        with self.lock:
            if att.ended or att.overran or not att.started:
                return
            att.overran = True
            self.overrunning += 1
            self.overruns += 1
        self.logger.warning(
            "a task's handler runs on past its cancel; its attempt keeps its place (capacity, concurrency limit) until it returns",
            extra={"task": att.task.name, "message_id": att.ctx.message_id, "attempt": att.ctx.attempt,
                   "past_cancel_seconds": round(time.monotonic() - att.cancelled_at, 3), "reason": att.reason},
        )

    def _hard_stop(self, att):
        proc = att.proc
        if att.ended or proc is None:
            return
        if proc.kill():
            with self.lock:
                self.killed += 1

    # --- running one attempt (on a worker)

    def _run(self, att):
        if att.cancelled_at is not None:
            # Cancelled while it waited for a worker: it never starts.
            ev = pb.RunTaskEvent(done=True, error="task %s was cancelled before it started: %s" % (att.task.name, att.reason))
        else:
            att.started = True
            if att.task.hard_stop is not None:
                from . import child

                ev = child.run(self, att)
            else:
                ev = run_handler(att.task, att.ctx, self.logger)
        self.ended(att)
        att.owner.finish(att, ev)

    # --- async def handlers, on one event loop

    def put_async(self, batch):
        """Starts the attempts of async def tasks on the loop."""
        loop = self._loop
        if loop is None:
            with self.lock:
                if self._loop is None:
                    import asyncio

                    self._loop = asyncio.new_event_loop()
                    threading.Thread(target=self._loop.run_forever, name="asyncio", daemon=True).start()
                loop = self._loop
        loop.call_soon_threadsafe(self._start_async, batch)

    def _start_async(self, batch):
        for att in batch:
            if att.cancelled_at is not None:
                self.ended(att)
                att.owner.finish(att, pb.RunTaskEvent(done=True, error="task %s was cancelled before it started: %s" % (att.task.name, att.reason)))
                continue
            att.started = True
            att.aio = self._loop.create_task(self._run_async(att))

    async def _run_async(self, att):
        import asyncio

        task, ctx = att.task, att.ctx
        try:
            raw = ctx.payload_json
            if raw and raw.strip():
                try:
                    ctx.payload = json.loads(raw)
                except ValueError as e:
                    raise errors.TaskError("task %s: the payload is not JSON: %s" % (task.name, e)) from None
            result = await task.fn(ctx, ctx.payload)
            ev = _DONE if result is None else final_event(task.name, result=result)
        except asyncio.CancelledError:
            ev = pb.RunTaskEvent(done=True, error="task %s was cancelled: %s" % (task.name, att.reason or "cancelled"))
        except BaseException as e:  # noqa: B902 - every failure is the attempt's
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                e = errors.TaskError("task %s raised %s" % (task.name, type(e).__name__))
            ev = final_event(task.name, exc=e, logger=self.logger)
        att.aio = None
        self.ended(att)
        att.owner.finish(att, ev)

    def ended(self, att):
        if att.cancelled_at is None:
            # Not cancelled (an overrun comes only after a cancel, and the
            # check of one sees this ended).
            att.ended = True
            return
        with self.lock:
            att.ended = True
            overran = att.overran
            if overran:
                self.overrunning -= 1
        if overran:
            self.logger.warning(
                "a task's handler returned after its cancel",
                extra={"task": att.task.name, "message_id": att.ctx.message_id, "attempt": att.ctx.attempt,
                       "past_cancel_seconds": round(time.monotonic() - att.cancelled_at, 3)},
            )

    def health_message(self):
        """A line for the plugin's health when handlers overran, else ""."""
        st = self.stats()
        if not (st["overrunning"] or st["overruns"] or st["killed"]):
            return ""
        return "task handlers running past their cancel: %d now, %d since start; hard_stop processes killed: %d" % (
            st["overrunning"], st["overruns"], st["killed"])


def run_handler(task, ctx, logger):
    """Runs task's handler in this thread and returns its final event."""
    try:
        raw = ctx.payload_json
        if raw and raw.strip():
            try:
                ctx.payload = json.loads(raw)
            except ValueError as e:
                raise errors.TaskError("task %s: the payload is not JSON: %s" % (task.name, e)) from None
        if task.is_async:  # one RunTask call: a loop of its own
            import asyncio

            result = asyncio.run(task.fn(ctx, ctx.payload))
        else:
            result = task.fn(ctx, ctx.payload)
        if result is None:
            return _DONE
        return final_event(task.name, result=result)
    except BaseException as e:  # noqa: B902 - every failure is the attempt's
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            e = errors.TaskError("task %s raised %s" % (task.name, type(e).__name__))
        return final_event(task.name, exc=e, logger=logger)


class TaskStream:
    """One RunTasks stream: its attempts, and the events waiting to be
    sent. The reader (a thread of its own) starts and cancels attempts;
    frames() is the response: the capacity, then batches of events."""

    def __init__(self, runner, request_iterator, context):
        self.runner = runner
        self.plugin = runner.plugin
        self.capacity = max(1, min(runner.plugin.max_tasks, 1 << 20))
        self._requests = request_iterator
        self._context = context
        self.lock = threading.Lock()
        self._cv = threading.Condition(self.lock)
        self._writer_waits = False
        self.running = {}  # attempt id -> Attempt
        self.out = []  # (attempt id, RunTaskEvent) not sent yet
        self._dropped = {}  # attempt id -> log lines dropped
        self.closed = False
        self._in_avg = 1.0  # attempts per frame from the caller, a moving average

    def frames(self):
        """The response stream: the capacity first, then what is ready."""
        r = self.runner
        with r.lock:
            r.streams.add(self)
        self._context.add_callback(self._close)
        threading.Thread(target=self._read, name="attempts", daemon=True).start()
        self.plugin.logger.info("serving a stream of attempts", extra={"capacity": self.capacity})
        yield pb.TaskReturn(capacity=self.capacity)
        cv = self._cv
        last = 0.0
        while True:
            with cv:
                while not self.out and not self.closed:
                    self._writer_waits = True
                    cv.wait()
            if LINGER and self._in_avg < SMALL_FRAME and time.monotonic() - last < BUSY and not self.closed:
                time.sleep(LINGER)
            with cv:
                batch, self.out = self.out, []
                closed = self.closed
            if batch:
                yield _frame(batch)
                last = time.monotonic()
            elif closed:
                return

    def _read(self):
        try:
            for d in self._requests:
                if d.attempts:
                    self._in_avg += (len(d.attempts) - self._in_avg) * 0.125
                    self._start(d.attempts)
                for c in d.cancels:
                    att = self.running.get(c.id)
                    if att is not None:
                        self.runner.cancel(att, c.reason or "cancelled by tasks_worker")
        except Exception as e:  # the stream broke (the RPC was cancelled)
            self.plugin.logger.debug("the stream of attempts ended", extra={"error": str(e)})
        self._close()

    def _start(self, attempts):
        plugin, r = self.plugin, self.runner
        tasks, config, logger, host = plugin.tasks, plugin.config, plugin.logger, r.host_services()
        now = None
        batch = []
        for a in attempts:
            aid = a.id
            task = tasks.get(a.task)
            if task is None or aid in self.running or r.stopping:
                if aid in self.running:
                    continue  # an id in flight: the caller broke the rules; the first keeps it
                why = ("plugin %s is stopping" % plugin.name) if r.stopping else ("plugin %s has no task %r" % (plugin.name, a.task))
                self._final(aid, pb.RunTaskEvent(done=True, error=why))
                continue
            deadline = None
            timeout = a.timeout_seconds or task.timeout
            if timeout:
                if now is None:
                    now = time.monotonic()
                deadline = now + timeout
            ctx = TaskContext(a.task, a.payload_json, a.message_id, a.attempt, config, logger, None, deadline, host, a.headers)
            att = Attempt(aid, task, ctx, self)
            ctx._send = _Sender(self, att)
            self.running[aid] = att
            batch.append(att)
        if batch:
            sync = [att for att in batch if not att.task.is_async]
            if len(sync) < len(batch):
                r.put_async([att for att in batch if att.task.is_async])
            if sync:
                r.workers.put(sync)
            if self.closed:  # closed while these were queued
                for att in batch:
                    r.cancel(att, "the stream of attempts ended")

    def finish(self, att, ev):
        """Queues att's final event; its handler has returned."""
        with self.lock:
            self.running.pop(att.id, None)
            dropped = self._dropped.pop(att.id, 0)
            if dropped:
                self.out.append((att.id, pb.RunTaskEvent(
                    log_line="(%d log lines dropped: the task logged faster than they could be sent)" % dropped)))
            self.out.append((att.id, ev))
            if self._writer_waits:
                self._writer_waits = False
                self._cv.notify()
            gone = self.closed and not self.running
        if gone:
            self._forget()

    def _final(self, aid, ev):
        with self.lock:
            self.out.append((aid, ev))
            if self._writer_waits:
                self._writer_waits = False
                self._cv.notify()

    def event(self, att, ev):
        """Queues a log or progress event of att, unless it has ended.
        Past MAX_QUEUED_EVENTS waiting (the caller reads slower than the
        tasks report), more are dropped, and an attempt's dropped log
        lines are counted in a line before its final event."""
        with self.lock:
            if att.ended or self.closed:
                return
            if len(self.out) >= MAX_QUEUED_EVENTS:
                if ev.log_line:
                    self._dropped[att.id] = self._dropped.get(att.id, 0) + 1
                return
            self.out.append((att.id, ev))
            if self._writer_waits:
                self._writer_waits = False
                self._cv.notify()

    def close(self):
        """Ends the stream: what is queued is sent, then the response
        ends; the attempts still running are cancelled."""
        self._close()

    def _close(self):
        """The caller closed its side, or the stream broke: the attempts
        still running are cancelled (their events have nowhere to go)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self._cv.notify_all()
            left = list(self.running.values())
        for att in left:
            self.runner.cancel(att, "the stream of attempts ended (tasks_worker stopped, or the host restarts)")
        if not left:
            self._forget()

    def _forget(self):
        with self.runner.lock:
            self.runner.streams.discard(self)


def _cancel_coroutine(att):
    """On the loop: a cancel raises CancelledError in att's coroutine at
    its next await."""
    t = att.aio
    if t is not None and not t.done():
        t.cancel()


def _frame(batch):
    """One TaskReturn with the events of batch, (id, RunTaskEvent) pairs."""
    f = pb.TaskReturn()
    add = f.events.add
    for aid, ev in batch:
        if ev is _DONE:
            e = add()
            e.id = aid
            e.event.done = True
        else:
            add(id=aid, event=ev)
    return f


class _Sender:
    """ctx._send of an attempt on a stream."""

    __slots__ = ("stream", "att")

    def __init__(self, stream, att):
        self.stream = stream
        self.att = att

    def __call__(self, ev):
        self.stream.event(self.att, ev)
