"""The host's services, as a plugin sees them (capability.HostServices).

The host offers them at each start over go-plugin's broker: Configure
carries a broker id, and the broker stream brings the address that id
stands for. The connection is made on first use, with the same mutual TLS
as the plugin's own server.
"""

import collections
import datetime
import json
import math
import threading

import grpc

from .errors import HostUnavailable, MAX_SNOOZE_SECONDS, SubmitRefused, TaskError
from .pb import plugin_pb2 as pb
from .pb import plugin_pb2_grpc as pbg

# What a submit answers for each task: its id, and whether a task holding
# the same unique key answered instead (nothing was stored; id is that
# task's).
SubmittedTask = collections.namedtuple("SubmittedTask", "id duplicate")

_SUBMIT_KEYS = ("task", "payload", "topic", "delay", "run_at", "max_attempts", "priority", "unique_key", "unique_for", "unique_states")


class HostServices:
    """What the host offers a plugin: the plugins it runs, their tasks, and
    running a task in another plugin. Every call is bound to this plugin."""

    def __init__(self, resolve, credentials=None, timeout=5.0):
        # resolve(timeout) returns the broker's ConnInfo for this start, or
        # None when none came.
        self._resolve = resolve
        self._credentials = credentials
        self._timeout = timeout
        self._lock = threading.Lock()
        self._channel = None
        self._stub = None

    def _host(self):
        with self._lock:
            if self._stub is None:
                info = self._resolve(self._timeout)
                if info is None:
                    raise HostUnavailable("the host offered no services to this plugin (no broker connection info)")
                target = ("unix:" + info.address) if info.network == "unix" else info.address
                if self._credentials is not None:
                    ch = grpc.secure_channel(target, self._credentials, [("grpc.ssl_target_name_override", "localhost")])
                else:
                    ch = grpc.insecure_channel(target)
                self._channel, self._stub = ch, pbg.HostServicesStub(ch)
            return self._stub

    def close(self):
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = self._stub = None

    def list_plugins(self, capability="", timeout=30):
        """Every enabled plugin (with capability, those serving it), as
        dicts with name, version, state and capabilities."""
        r = self._host().ListPlugins(pb.ListPluginsRequest(capability=capability), timeout=timeout)
        return [{"name": p.name, "version": p.version, "state": p.state, "capabilities": list(p.capabilities)} for p in r.plugins]

    def list_tasks(self, plugin, timeout=30):
        """The tasks the named plugin provides, as dicts."""
        r = self._host().ListTasks(pb.HostListTasksRequest(plugin=plugin), timeout=timeout)
        return [{"name": t.name, "description": t.description, "topic": t.topic, "max_attempts": t.max_attempts} for t in r.tasks]

    def submit_tasks(self, tasks, parent_task_id="", timeout=30):
        """Queues tasks in the task system (tasks_worker), as this plugin:
        all of them, or none and an error. Each is a dict with "task" and
        any of "payload", "topic", "delay", "run_at", "max_attempts",
        "priority", "unique_key", "unique_for", "unique_states" (see
        submission). parent_task_id records the task that submits them
        (ctx.submit sets it). Returns a SubmittedTask(id, duplicate) per
        task, in order. Raises ValueError for a task the SDK can tell is
        wrong before sending it, SubmitRefused (a TaskError and a
        ValueError) when the task system refuses one, HostUnavailable
        when it does not run or the host cannot be reached."""
        if isinstance(tasks, dict):
            raise ValueError("submit_tasks takes a list of tasks (dicts), not one dict")
        subs = []
        for i, t in enumerate(tasks):
            if not isinstance(t, dict):
                raise ValueError("task %d to submit is a %s, not a dict with \"task\" and its options" % (i + 1, type(t).__name__))
            unknown = sorted(set(t) - set(_SUBMIT_KEYS))
            if unknown:
                raise ValueError("task %d to submit has unknown keys %s; the keys are %s" % (i + 1, ", ".join(unknown), ", ".join(_SUBMIT_KEYS)))
            try:
                subs.append(submission(parent_task_id=parent_task_id, **t))
            except (TypeError, ValueError) as e:
                raise ValueError("task %d to submit (%s): %s" % (i + 1, t.get("task"), e)) from None
        if not subs:
            return []
        try:
            r = self._host().SubmitTasks(pb.SubmitTasksRequest(tasks=subs), timeout=timeout)
        except grpc.RpcError as e:
            raise submit_error(e) from None
        return [SubmittedTask(t.id, t.duplicate) for t in r.tasks]

    def run_task(self, plugin, task, payload=None, message_id="", attempt=1, on_log=None, on_progress=None, timeout=None):
        """Runs a task in the named plugin and returns its decoded result;
        raises TaskError with the task's error when it fails."""
        req = pb.RunTaskRequest(task=task, payload_json=json.dumps(payload).encode() if payload is not None else b"", message_id=message_id, attempt=attempt)
        stream = self._host().RunTask(pb.HostRunTaskRequest(plugin=plugin, request=req), timeout=timeout)
        for ev in stream:
            if ev.done:
                if ev.error:
                    raise TaskError(ev.error)
                return json.loads(ev.result_json) if ev.result_json else None
            if ev.has_progress:
                if on_progress:
                    on_progress(ev.progress)
            elif ev.log_line and on_log:
                on_log(ev.log_line)
        raise HostUnavailable("run task %s in %s: the stream ended without a result" % (task, plugin))


def submit_error(e):
    """The exception for a SubmitTasks call that failed with e."""
    code, msg = e.code(), e.details() or str(e)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return SubmitRefused("submit refused: " + msg)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return HostUnavailable("submit: the task system cannot take tasks now: " + msg)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return HostUnavailable("submit: this host does not take tasks from plugins (it predates SubmitTasks): " + msg)
    return TaskError("submit: %s: %s" % (code.name, msg))


def _seconds(v, what):
    if isinstance(v, datetime.timedelta):
        v = v.total_seconds()
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= MAX_SNOOZE_SECONDS:
        raise ValueError("%s must be a number of seconds (or a timedelta) from 0 to %d, not %r" % (what, MAX_SNOOZE_SECONDS, v))
    return float(v)


def submission(task, payload=None, topic="", delay=None, run_at=None, max_attempts=0, priority=0, unique_key=None,
               unique_for=None, unique_states=None, parent_task_id=""):
    """One task to submit, as the host takes it (TaskSubmission):

    task           the task's name (registered in tasks_worker).
    payload        anything json.dumps takes, RawJSON, or None (no payload).
    topic          "" is the task's own topic.
    delay          seconds (or a timedelta) before it may run; or
    run_at         an aware datetime (or RFC 3339 text) when it may run.
    max_attempts   0 is the task's own.
    priority       higher runs first within its topic.
    unique_key     a text: a submit while a task with this key is queued or
                   running (unique_states) answers that task, duplicate.
    unique_for     seconds (or a timedelta) the key holds after it ends.
    """
    from .plugin import RawJSON

    if not isinstance(task, str) or not task:
        raise ValueError("the task's name must be a non-empty string, not %r" % (task,))
    if not isinstance(topic, str):
        raise ValueError("topic must be a string, not %r" % (topic,))
    if payload is None:
        body = b""
    elif isinstance(payload, RawJSON):
        body = bytes(payload)
    else:
        try:
            body = json.dumps(payload, allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise ValueError("the payload is not JSON: %s" % e) from None
    sub = pb.TaskSubmission(task=task, topic=topic, payload_json=body, parent_task_id=str(parent_task_id or ""))
    if delay is not None and run_at is not None:
        raise ValueError("give a delay or a run_at, not both")
    if delay is not None:
        sub.delay_seconds = _seconds(delay, "delay")
    if run_at is not None:
        if isinstance(run_at, datetime.datetime):
            if run_at.tzinfo is None:
                raise ValueError("run_at must be a timezone-aware datetime (e.g. datetime.now(timezone.utc)), not a naive one")
            sub.run_at = run_at.astimezone(datetime.timezone.utc).isoformat().replace("+00:00", "Z")
        elif isinstance(run_at, str) and run_at:
            sub.run_at = run_at
        else:
            raise ValueError("run_at must be an aware datetime or RFC 3339 text, not %r" % (run_at,))
    for name, v in (("max_attempts", max_attempts), ("priority", priority)):
        if isinstance(v, bool) or not isinstance(v, int) or not -(1 << 31) <= v < (1 << 31):
            raise ValueError("%s must be an integer, not %r" % (name, v))
    sub.max_attempts, sub.priority = max_attempts, priority
    if unique_key is not None:
        if not isinstance(unique_key, str):
            raise ValueError("unique_key must be a string, not %r" % (unique_key,))
        sub.unique_key, sub.unique_key_set = unique_key, True
    if unique_for is not None:
        sub.unique_for_seconds = _seconds(unique_for, "unique_for")
    if unique_states is not None:
        if isinstance(unique_states, str) or not all(isinstance(x, str) for x in unique_states):
            raise ValueError("unique_states must be a list of states, not %r" % (unique_states,))
        sub.unique_states.extend(unique_states)
    return sub
