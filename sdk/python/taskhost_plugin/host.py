"""The host's services, as a plugin sees them (capability.HostServices).

The host offers them at each start over go-plugin's broker: Configure
carries a broker id, and the broker stream brings the address that id
stands for. The connection is made on first use, with the same mutual TLS
as the plugin's own server.
"""

import json
import threading

import grpc

from .errors import TaskError
from .pb import plugin_pb2 as pb
from .pb import plugin_pb2_grpc as pbg


class HostUnavailable(Exception):
    """The host's services cannot be reached (the host offered none, or
    the connection failed)."""


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
