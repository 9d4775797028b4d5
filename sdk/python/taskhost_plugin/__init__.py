"""taskhost_plugin: task plugins for taskhost, written in Python.

    import taskhost_plugin as th

    plugin = th.Plugin("pytasks", version="1.0.0")

    @plugin.task("pytasks.greet", max_attempts=3, timeout=30)
    def greet(ctx, payload):
        ctx.log("greeting " + payload["name"])
        ctx.progress(1.0)
        return {"greeting": "hello, " + payload["name"]}

    if __name__ == "__main__":
        plugin.serve()

The host runs the file as a supervised plugin, like a Go one: see
sdk/python/README.md. Only Debian's python3-grpcio, python3-protobuf and
python3-cryptography are used; the gRPC stubs are generated and
committed (make proto/python).
"""

import os as _os

# The host's pid, read as early as possible: serve() exits when the
# parent changes (the host died), and a host that dies while the plugin
# starts must count too.
HOST_PID = _os.getppid()

from .errors import (  # noqa: E402
    CancelTask, HostUnavailable, InvalidConfig, MAX_SNOOZE_SECONDS, Permanent, RetryAfter, Snooze, SubmitRefused, TaskError,
)
from .host import SubmittedTask  # noqa: E402
from .plugin import PROTOCOL_VERSION, Plugin, RawJSON, TaskContext  # noqa: E402

__all__ = [
    "CancelTask",
    "HostUnavailable",
    "InvalidConfig",
    "MAX_SNOOZE_SECONDS",
    "PROTOCOL_VERSION",
    "Permanent",
    "Plugin",
    "RawJSON",
    "RetryAfter",
    "Snooze",
    "SubmitRefused",
    "SubmittedTask",
    "TaskContext",
    "TaskError",
]
