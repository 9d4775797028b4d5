"""hard_stop: a task's handler in a child process, which can be killed.

Python cannot stop a thread, so a handler that ignores its cancel runs on
and keeps its attempt's place. A task declared with hard_stop runs each
attempt in a fork of the plugin instead: the child inherits the plugin as
it is (its modules, its config, what on_configure set up), runs the
handler, and sends its events to the plugin over a socket pair. When the
attempt is cancelled, the child's ctx.cancelled turns true; if the
handler has not returned the task's grace later, the plugin kills the
child (SIGKILL) and ends the attempt with an error, so its place is free
at once and nothing of it runs any more.

The child speaks to the plugin with length-prefixed pickles:

    child -> plugin  ("ev", RunTaskEvent bytes)     log, progress, the final event
                     ("host", n, method, args, kw)  a call of ctx.host (submit, ...)
    plugin -> child  ("cancel", reason)
                     ("reply", n, ok, value)        the call's result, or its exception
"""

import ctypes
import os
import pickle
import signal
import socket
import struct
import threading
import time

from . import errors
from .pb import plugin_pb2 as pb

_LEN = struct.Struct(">I")
_PR_SET_PDEATHSIG = 1


class Channel:
    """One end of the socket pair: whole messages, sent under a lock."""

    def __init__(self, sock):
        self.sock = sock
        self._lock = threading.Lock()

    def send(self, msg):
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self.sock.sendall(_LEN.pack(len(data)) + data)

    def recv(self):
        """The next message, or None at the end of the stream."""
        head = self._read(_LEN.size)
        if head is None:
            return None
        body = self._read(_LEN.unpack(head)[0])
        if body is None:
            return None
        return pickle.loads(body)

    def _read(self, n):
        buf = bytearray()
        while len(buf) < n:
            try:
                b = self.sock.recv(n - len(buf))
            except OSError:
                return None
            if not b:
                return None
            buf += b
        return bytes(buf)


class Proc:
    """The plugin's handle on one child process."""

    def __init__(self, pid, chan):
        self.pid = pid
        self.chan = chan
        self.killed_at = None
        self.reaped = False
        self._lock = threading.Lock()

    def cancel(self, reason):
        try:
            self.chan.send(("cancel", reason))
        except OSError:
            pass  # it has ended

    def kill(self):
        """SIGKILL, unless it has been reaped; True if the signal went."""
        with self._lock:
            if self.reaped or self.killed_at is not None:
                return False
            self.killed_at = time.monotonic()
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                return False
            return True

    def reap(self):
        _, status = os.waitpid(self.pid, 0)
        with self._lock:
            self.reaped = True
        return status


def run(runner, att):
    """Runs att's handler in a child process and returns its final event;
    called on a worker thread, which waits for the child."""
    task = att.task
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        pid = os.fork()
    except OSError as e:
        mine.close()
        theirs.close()
        return pb.RunTaskEvent(done=True, error="task %s: cannot start its process (hard_stop): %s" % (task.name, e))
    if pid == 0:  # the child
        try:
            mine.close()
            _child(Channel(theirs), att, runner.logger)
        finally:
            os._exit(1)
    theirs.close()
    chan = Channel(mine)
    proc = Proc(pid, chan)
    att.proc = proc
    # A cancel that came while the child started: pass it on, and kill
    # at once if its grace is over.
    if att.cancelled_at is not None:
        proc.cancel(att.reason)
        if time.monotonic() >= att.cancelled_at + task.hard_stop:
            runner._hard_stop(att)
    final = None
    try:
        while True:
            msg = chan.recv()
            if msg is None:
                break
            kind = msg[0]
            if kind == "ev":
                ev = pb.RunTaskEvent.FromString(msg[1])
                if ev.done:
                    final = ev
                else:
                    att.ctx._send(ev)
            elif kind == "host":
                threading.Thread(target=_host_call, args=(chan, att.ctx.host, msg), name="hard_stop host call", daemon=True).start()
    finally:
        status = proc.reap()
        mine.close()
    if final is not None:
        return final
    if proc.killed_at is not None:
        return pb.RunTaskEvent(done=True, error="task %s was killed %.1f s after its cancel (hard_stop): %s" % (
            task.name, proc.killed_at - att.cancelled_at, att.reason))
    if os.WIFSIGNALED(status):
        how = "was killed by signal %d" % os.WTERMSIG(status)
    else:
        how = "exited with status %d" % os.WEXITSTATUS(status)
    return pb.RunTaskEvent(done=True, error="task %s: its process (hard_stop) %s before it returned" % (task.name, how))


def _host_call(chan, host, msg):
    _, n, method, args, kwargs = msg
    try:
        if host is None:
            raise errors.HostUnavailable("the host's services are not available here (the plugin is not configured by a host)")
        if method not in ("submit_tasks", "list_plugins", "list_tasks", "run_task"):
            raise ValueError("ctx.host.%s is not available to a hard_stop task" % method)
        reply = ("reply", n, True, getattr(host, method)(*args, **kwargs))
    except Exception as e:
        reply = ("reply", n, False, e)
    try:
        chan.send(reply)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        try:
            chan.send(("reply", n, False, errors.TaskError("ctx.host.%s: its answer cannot be sent to the task's process" % method)))
        except OSError:
            pass


class _ChildHost:
    """ctx.host in the child: each call is made by the plugin."""

    def __init__(self, chan):
        self._chan = chan
        self._lock = threading.Lock()
        self._n = 0
        self._waits = {}  # n -> [Event, reply]

    def _call(self, method, *args, **kwargs):
        if any(callable(v) for v in list(args) + list(kwargs.values())):
            raise ValueError("ctx.host.%s in a hard_stop task takes no callbacks (on_log, on_progress)" % method)
        with self._lock:
            self._n += 1
            n = self._n
            slot = self._waits[n] = [threading.Event(), None]
        self._chan.send(("host", n, method, args, kwargs))
        slot[0].wait()
        ok, value = slot[1]
        if not ok:
            raise value
        return value

    def _reply(self, n, ok, value):
        with self._lock:
            slot = self._waits.pop(n, None)
        if slot is not None:
            slot[1] = (ok, value)
            slot[0].set()

    def _gone(self):
        with self._lock:
            waits, self._waits = self._waits, {}
        for slot in waits.values():
            slot[1] = (False, errors.HostUnavailable("the plugin went away"))
            slot[0].set()

    def submit_tasks(self, tasks, parent_task_id="", timeout=30):
        return self._call("submit_tasks", tasks, parent_task_id=parent_task_id, timeout=timeout)

    def list_plugins(self, capability="", timeout=30):
        return self._call("list_plugins", capability, timeout=timeout)

    def list_tasks(self, plugin, timeout=30):
        return self._call("list_tasks", plugin, timeout=timeout)

    def run_task(self, plugin, task, payload=None, message_id="", attempt=1, on_log=None, on_progress=None, timeout=None):
        return self._call("run_task", plugin, task, payload, message_id=message_id, attempt=attempt, on_log=on_log,
                          on_progress=on_progress, timeout=timeout)


def _child(chan, att, logger):
    """The child's life: runs the handler, sends its final event, exits."""
    from . import plugin
    from .runner import run_handler

    plugin._wait_lock = threading.Lock()

    try:  # dies with the thread of the plugin that forked it
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    ctx = att.ctx
    ctx._event = None  # made afresh: the plugin's may be held
    host = _ChildHost(chan)
    if ctx.host is not None:
        ctx.host = host

    def send(ev):
        try:
            chan.send(("ev", ev.SerializeToString()))
        except OSError:
            pass

    ctx._send = send

    def listen():
        while True:
            msg = chan.recv()
            if msg is None:
                host._gone()
                return
            if msg[0] == "cancel":
                ctx.cancel()
            elif msg[0] == "reply":
                host._reply(*msg[1:])

    threading.Thread(target=listen, name="plugin", daemon=True).start()
    ev = run_handler(att.task, ctx, logger)
    try:
        chan.send(("ev", ev.SerializeToString()))
        chan.sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    for h in list(__import__("logging").getLogger().handlers):
        try:
            h.flush()
        except Exception:
            pass
    os._exit(0)
