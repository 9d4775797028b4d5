"""A plugin: its name, its tasks, and how one attempt of a task runs."""

import inspect
import json
import logging
import math
import queue
import re
import sys
import threading
import time
import traceback

from . import errors
from .pb import plugin_pb2 as pb

# The rules the host keeps (capability.ValidName, worker.Register).
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
TASK_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$")
MAX_TASK_LEN = 200
MAX_TOPIC_LEN = 200
MAX_ATTEMPTS = 1000

PROTOCOL_VERSION = 1

# How long a hard_stop task's handler has, after its cancel, to return
# by itself before its process is killed.
HARD_STOP_GRACE = 1.0

# A plugin's max_tasks when it does not say: room for tasks_worker's
# workers and the attempts it sends beyond them (a stream keeps more in
# flight than one call per attempt did), while the threads, started only
# as attempts need them, stay few for quick tasks.
DEFAULT_MAX_TASKS = 64

# A task's timeout is the host's to enforce (TaskSpec.timeout_seconds: the
# worker cancels the call and fails the attempt as timed out). The SDK
# ends the attempt itself this much later, for a host that predates the
# field.
TIMEOUT_GRACE = 1.0


class RawJSON(bytes):
    """A task result that is JSON text already: sent as it is, not encoded
    again. The host refuses (fails the attempt) text that is not JSON."""


class Task:
    """One declared task (see Plugin.task)."""

    def __init__(self, name, fn, topic="", max_attempts=0, timeout=None, description="", hard_stop=None):
        self.name = name
        self.fn = fn
        self.topic = topic
        self.max_attempts = max_attempts
        self.timeout = timeout
        self.description = description
        # None: the handler runs in a thread of the plugin. Else it runs in
        # a child process, killed this many seconds after a cancel.
        self.hard_stop = hard_stop
        # An async def runs on the plugin's event loop (a thread of its own).
        self.is_async = inspect.iscoroutinefunction(fn)

    def spec(self):
        return pb.TaskSpec(name=self.name, description=self.description, topic=self.topic, max_attempts=self.max_attempts,
                           timeout_seconds=float(self.timeout or 0))


_wait_lock = threading.Lock()


class TaskContext:
    """What a task gets besides its payload: who it is, and how it reports.

    payload      the decoded JSON payload (None when the task was submitted
                 without one); payload_json is the raw bytes.
    attempt      the attempt number, from 1.
    message_id   the task's id in the task system, as a string.
    headers      the task's headers as submitted (a dict: the plugin that
                 submitted it, its parent task, trace context); empty on a
                 host that does not send them.
    config       the plugin's config block (a dict).
    logger       the plugin's logger (stderr, in the host's log).
    host         the host's services (HostServices): other plugins and
                 their tasks; None outside the host.
    """

    def __init__(self, task, payload_json, message_id, attempt, config, logger, send, deadline=None, host=None, headers=None):
        self.task = task
        self.payload_json = payload_json
        self.message_id = message_id
        self.attempt = attempt
        self.config = config
        self.logger = logger
        self.deadline = deadline  # time.monotonic() value, or None
        self.host = host
        self._send = send
        self._headers = headers
        # Made by the first wait(): most attempts never wait.
        self._cancelled = False
        self._event = None
        self.payload = None

    @property
    def headers(self):
        h = self._headers
        if h is None:
            return {}
        if not isinstance(h, dict):  # the attempt's map, read on first use
            h = self._headers = dict(h)
        return h

    def log(self, line):
        """Adds a line to the attempt's log, shown in the task's report."""
        line = str(line)
        if line:
            self._send(pb.RunTaskEvent(log_line=line))

    def progress(self, fraction):
        """Reports how far the attempt is, from 0.0 to 1.0."""
        f = float(fraction)
        if not math.isfinite(f):
            raise ValueError("progress must be a number from 0 to 1, not %r" % (fraction,))
        self._send(pb.RunTaskEvent(progress=min(max(f, 0.0), 1.0), has_progress=True))

    @property
    def cancelled(self):
        """True once the attempt should stop: its timeout passed, the host
        gave up on it (the worker stops, the task was cancelled), or the
        plugin stops. The handler should then return soon: until it does,
        the attempt keeps its place in its topic's concurrency limit."""
        return self._cancelled

    def wait(self, seconds):
        """Sleeps up to seconds; returns True at once if the attempt is
        cancelled meanwhile (then stop and return or raise)."""
        if self._cancelled:
            return True
        ev = self._event
        if ev is None:
            with _wait_lock:
                ev = self._event
                if ev is None:
                    ev = self._event = threading.Event()
            if self._cancelled:  # a cancel that came before the event was made
                ev.set()
        return ev.wait(seconds)

    def time_left(self):
        """Seconds until the task's timeout, or None without one."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    def submit(self, task, payload=None, topic="", delay=None, run_at=None, max_attempts=0, priority=0, unique_key=None,
               unique_for=None, unique_states=None):
        """Queues a task in the task system, as this plugin, recorded as a
        child of this one (its headers carry parent_task_id, this task's
        message_id). Returns SubmittedTask(id, duplicate). Raises
        ValueError for a bad argument, SubmitRefused when the task system
        refuses it, HostUnavailable when it does not run. See
        HostServices.submit_tasks for the options."""
        t = {"task": task, "payload": payload, "topic": topic, "delay": delay, "run_at": run_at, "max_attempts": max_attempts,
             "priority": priority, "unique_key": unique_key, "unique_for": unique_for, "unique_states": unique_states}
        return self.submit_many([t])[0]

    def submit_many(self, tasks):
        """Queues several tasks at once (dicts with "task" and the options
        of submit), all or none, each a child of this one; returns a
        SubmittedTask per task, in order."""
        if self.host is None:
            raise errors.HostUnavailable("the host's services are not available here (the plugin is not configured by a host)")
        return self.host.submit_tasks(tasks, parent_task_id=self.message_id)

    def cancel(self):
        self._cancelled = True
        ev = self._event
        if ev is not None:
            ev.set()


def final_event(task_name, result=None, exc=None, logger=None):
    """The attempt's last event: its result, or its error and outcome."""
    if exc is None:
        if result is None:
            return pb.RunTaskEvent(done=True)
        if isinstance(result, RawJSON):
            return pb.RunTaskEvent(done=True, result_json=bytes(result))
        try:
            body = json.dumps(result, allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError) as e:
            return pb.RunTaskEvent(done=True, error="task %s returned a result that is not JSON: %s" % (task_name, e))
        return pb.RunTaskEvent(done=True, result_json=body)
    if isinstance(exc, errors.Snooze):
        try:
            s = errors.check_snooze(exc.seconds)
        except ValueError as e:
            return pb.RunTaskEvent(done=True, error="task %s: %s" % (task_name, e))
        return pb.RunTaskEvent(done=True, error=str(exc) or "snoozed", outcome=pb.OUTCOME_SNOOZE, snooze_seconds=s)
    if isinstance(exc, errors.RetryAfter):
        try:
            s = errors.check_snooze(exc.seconds, "a retry delay")
        except ValueError as e:
            return pb.RunTaskEvent(done=True, error="task %s: %s" % (task_name, e))
        return pb.RunTaskEvent(done=True, error=str(exc) or "task failed", retry_after_seconds=s)
    if isinstance(exc, errors.Permanent):
        return pb.RunTaskEvent(done=True, error=str(exc) or "failed permanently", outcome=pb.OUTCOME_PERMANENT)
    if isinstance(exc, errors.CancelTask):
        return pb.RunTaskEvent(done=True, error=str(exc) or "cancelled by the task", outcome=pb.OUTCOME_CANCEL)
    if isinstance(exc, errors.TaskError):
        return pb.RunTaskEvent(done=True, error=str(exc) or "task failed")
    if logger is not None:
        logger.error("task raised %s", type(exc).__name__, exc_info=(type(exc), exc, exc.__traceback__), extra={"task": task_name})
    msg = str(exc)
    return pb.RunTaskEvent(done=True, error=type(exc).__name__ + (": " + msg if msg else ""))


class Run:
    """One attempt of a RunTask call (a host, or a plugin, without the
    stream of attempts): the handler runs in its own thread; events()
    yields what it reports, then its final event. A handler still running
    at its timeout is abandoned (Python cannot stop a thread): the host
    cancels the call at the timeout (abort), or else the SDK ends the
    attempt grace seconds later; either way its context says cancelled,
    and what it does later is dropped. on_end() is called once, when the
    handler returns or the attempt is given up, whichever comes first."""

    def __init__(self, task, req, config, logger, host=None, grace=TIMEOUT_GRACE, on_end=None):
        self.task = task
        self.logger = logger
        self.q = queue.Queue()
        self.done = threading.Event()
        self.end = None  # when the SDK ends the attempt itself
        self.started = False
        self._on_end = on_end
        self._ended = False
        self._end_lock = threading.Lock()
        deadline = None
        if task.timeout:
            deadline = time.monotonic() + task.timeout
            self.end = deadline + grace
        self.ctx = TaskContext(task.name, req.payload_json, req.message_id, req.attempt, config, logger, self._send, deadline, host)

    def _send(self, ev):
        if self.done.is_set():
            return
        self.q.put(ev)

    def ended(self):
        """Calls on_end, once."""
        with self._end_lock:
            if self._ended:
                return
            self._ended = True
        if self._on_end is not None:
            self._on_end()

    def abort(self):
        """The host gave up on the attempt (the call was cancelled): tells
        the handler, and ends events() at once, even if the handler never
        returns."""
        self.ctx.cancel()
        self.ended()
        self.q.put(None)

    def _target(self):
        from .runner import run_handler

        ev = run_handler(self.task, self.ctx, self.logger)
        # The place is free before the host sees the final event, so that
        # its next call finds it free.
        self.ended()
        self.q.put(ev)

    def events(self):
        """Yields the attempt's events; the last has done set."""
        self.started = True
        t = threading.Thread(target=self._target, name="task " + self.task.name, daemon=True)
        t.start()
        try:
            while True:
                timeout = None
                if self.end is not None:
                    timeout = self.end - time.monotonic()
                    if timeout <= 0:
                        self.ctx.cancel()
                        self.ended()
                        self.logger.warning("task timed out; its thread is left to end by itself", extra={"task": self.task.name, "timeout_seconds": self.task.timeout})
                        yield pb.RunTaskEvent(done=True, error="task %s timed out after %s s" % (self.task.name, _secs(self.task.timeout)))
                        return
                try:
                    ev = self.q.get(timeout=timeout)
                except queue.Empty:
                    continue
                if ev is None:  # aborted
                    return
                yield ev
                if ev.done:
                    return
        finally:
            self.done.set()
            self.ctx.cancel()
            self.ended()


def _secs(v):
    return ("%g" % v) if isinstance(v, float) else str(v)


class Plugin:
    """A task plugin. Declare its tasks with @plugin.task, then call
    plugin.serve() as the script's last statement."""

    def __init__(self, name, version="0.0.0", max_tasks=DEFAULT_MAX_TASKS, stream=True):
        if not NAME_PATTERN.match(name or ""):
            raise ValueError("plugin name %r is not valid: lower-case letters, digits and _, starting with a letter, at most 41 characters" % (name,))
        if isinstance(max_tasks, bool) or not isinstance(max_tasks, int) or not 1 <= max_tasks <= 4096:
            raise ValueError("max_tasks must be an integer from 1 to 4096, not %r" % (max_tasks,))
        self.name = name
        self.version = version
        # The most attempts whose handlers run at once: the capacity the
        # plugin gives tasks_worker, and the number of its worker threads.
        self.max_tasks = max_tasks
        # Serve the stream of attempts (capability tasks_stream); False:
        # one RunTask call per attempt, as plugins built before it.
        self.stream = stream
        self.tasks = {}
        self.config = {}
        # The host's services (HostServices), set at each start.
        self.host = None
        self._configure_hooks = []
        self._stop_hooks = []
        self._health = None
        self._config_check = None
        self.logger = logging.getLogger(name)

    def task(self, name, topic="", max_attempts=0, timeout=None, description="", hard_stop=False):
        """Declares a task: @plugin.task("images.resize", topic="images",
        max_attempts=5, timeout=60). The function takes a TaskContext and
        the decoded payload, and returns the result (anything json.dumps takes, or RawJSON), or
        raises (TaskError, RetryAfter, Snooze, Permanent, CancelTask, any exception).

        hard_stop=True runs each attempt's handler in a child process (a
        fork of the plugin) that is killed HARD_STOP_GRACE seconds after
        the attempt's cancel (its timeout, an operator's cancel) if it has
        not returned by then; a number of seconds sets that grace."""
        problem = _check_task(name, topic, max_attempts, timeout)
        if problem:
            raise ValueError("task %r: %s" % (name, problem))
        if name in self.tasks:
            raise ValueError("task %r is declared twice" % (name,))
        if hard_stop is True:
            grace = HARD_STOP_GRACE
        elif hard_stop is False or hard_stop is None:
            grace = None
        elif isinstance(hard_stop, (int, float)) and math.isfinite(hard_stop) and hard_stop >= 0:
            grace = float(hard_stop)
        else:
            raise ValueError("task %r: hard_stop must be True, False or the seconds a handler has after its cancel, not %r" % (name, hard_stop))

        def register(fn):
            if grace is not None and inspect.iscoroutinefunction(fn):
                raise ValueError("task %r: hard_stop runs a plain function in a process of its own, not an async def" % (name,))
            desc = description or (fn.__doc__ or "").strip().split("\n")[0]
            self.tasks[name] = Task(name, fn, topic, max_attempts, timeout, desc, grace)
            return fn

        return register

    def on_configure(self, fn):
        """Declares fn(config: dict), called with the plugin's config block
        each time the plugin starts. Raise InvalidConfig for a bad one."""
        self._configure_hooks.append(fn)
        return fn

    def on_stop(self, fn):
        """Declares fn(), called once the plugin has drained, before it
        exits."""
        self._stop_hooks.append(fn)
        return fn

    def health_check(self, fn):
        """Declares fn() -> None (healthy) or a string saying what is
        wrong (the plugin is shown degraded with it)."""
        self._health = fn
        return fn

    def check_config(self, fn):
        """Declares fn(config: dict), run by `host check-config`: raise
        InvalidConfig for a bad block, without starting anything."""
        self._config_check = fn
        return fn

    def configure(self, raw):
        cfg = {}
        if raw and raw.strip():
            try:
                cfg = json.loads(raw)
            except ValueError as e:
                raise errors.InvalidConfig("the config block is not JSON: %s" % e) from None
        if cfg is None:
            cfg = {}
        for hook in self._configure_hooks:
            hook(cfg)
        self.config = cfg

    def health(self):
        if self._health is None:
            return None
        return self._health()

    def stopped(self):
        for hook in self._stop_hooks:
            try:
                hook()
            except Exception:
                self.logger.exception("stop hook failed")

    def serve(self):
        """Runs the plugin for the host; returns never (exits the process)."""
        from . import server
        server.serve(self)
        sys.exit(0)


def _check_task(name, topic, max_attempts, timeout):
    if not isinstance(name, str) or not name:
        return "the name is empty"
    if len(name.encode()) > MAX_TASK_LEN:
        return "the name is %d bytes long, the limit is %d" % (len(name.encode()), MAX_TASK_LEN)
    if not TASK_PATTERN.match(name):
        return "a name may hold only letters, digits and _ . : / - (and not start with a punctuation mark)"
    if not isinstance(topic, str) or len(topic.encode()) > MAX_TOPIC_LEN or topic != topic.strip():
        return "the topic must be a string of at most %d bytes, without white space at either end" % MAX_TOPIC_LEN
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or not 0 <= max_attempts <= MAX_ATTEMPTS:
        return "max_attempts must be an integer from 0 (the host's default) to %d" % MAX_ATTEMPTS
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0):
        return "timeout must be a number of seconds above 0, or None for no timeout"
    return ""


def format_exc():
    return traceback.format_exc()
