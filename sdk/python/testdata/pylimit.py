"""pylimit: a task that ignores its timeout, on a topic limited to one at
once (stream_host_test.go). Each handler appends to the file named by the
config's "spans" when it starts, with how many of its handlers run in the
plugin then, and when it ends; the test reads the file. It uses only what
every version of the SDK offers, so that the test can run against an
older one (TASKHOST_TEST_PYSDK)."""

import os
import threading
import time

import taskhost_plugin as th

plugin = th.Plugin("pylimit", version="0.1.0")
lock = threading.Lock()
running = [0]
spans = [None]


@plugin.on_configure
def configure(cfg):
    spans[0] = cfg.get("spans")


def note(line):
    fd = os.open(spans[0], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@plugin.task("pylimit.sleepy", topic="one", max_attempts=1, timeout=0.2)
def sleepy(ctx, payload):
    """Sleeps {"seconds": s} whatever its 0.2 s timeout says."""
    with lock:
        running[0] += 1
        note("start %s %d %.6f" % (ctx.message_id, running[0], time.time()))
    try:
        time.sleep(float(payload["seconds"]))
    finally:
        with lock:
            running[0] -= 1
            note("end %s %d %.6f" % (ctx.message_id, running[0], time.time()))
    return {"slept": payload["seconds"]}


@plugin.task("pylimit.noop")
def noop(ctx, payload):
    """Does nothing: load beside the limited topic."""
    return None


if __name__ == "__main__":
    plugin.serve()
