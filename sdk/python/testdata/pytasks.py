"""pytasks: the host tests' Python plugin; each task exercises one path."""

import asyncio
import os
import sys
import time

import taskhost_plugin as th

plugin = th.Plugin("pytasks", version="0.1.0")


@plugin.check_config
@plugin.on_configure
def check(cfg):
    if cfg.get("color", "red") not in ("red", "blue"):
        raise th.InvalidConfig("must be red or blue", key="color")


@plugin.task("pytasks.count", max_attempts=5)
def count(ctx, payload):
    """Counts to {"to": n}, one step every {"step_ms": m}, with progress."""
    n, step = int(payload["to"]), int(payload.get("step_ms", 100)) / 1000.0
    for i in range(1, n + 1):
        if ctx.wait(step):
            raise th.TaskError("cancelled at %d" % i)
        ctx.progress(i / n)
        if i % 10 == 0:
            ctx.log("counted %d" % i)
    return {"counted": n}


@plugin.task("pytasks.noop")
def noop(ctx, payload):
    """Does nothing: the per-task cost of a Python task (bench/providers.sh)."""
    return None


@plugin.task("pytasks.relay", max_attempts=1)
def relay(ctx, payload):
    """Lists the task plugins and runs pyexample.greet through the host."""
    names = sorted(p["name"] for p in ctx.host.list_plugins("tasks") if p["state"] == "running")
    tasks = sorted(t["name"] for t in ctx.host.list_tasks("pyexample"))
    logs = []
    res = ctx.host.run_task("pyexample", "pyexample.greet", {"name": "relay"}, on_log=logs.append)
    return {"plugins": names, "tasks": tasks, "greeting": res["greeting"], "logs": logs}


@plugin.task("pytasks.print", max_attempts=1)
def print_task(ctx, payload):
    """Prints to stdout, which a plugin must not do."""
    print("a stray line from pytasks.print")
    sys.stdout.flush()
    return {"printed": True}


@plugin.task("pytasks.stderr", max_attempts=1)
def stderr_task(ctx, payload):
    """Writes to stderr directly, a line go-plugin would take for a log entry."""
    print('{"@message": 1, "@level": 2, "@timestamp": 3}', file=sys.stderr)
    return {"written": True}


@plugin.task("pytasks.hang", max_attempts=1, timeout=1, hard_stop=True)
def hang(ctx, payload):
    """Ignores its 1 s timeout and cancellation: its process is killed."""
    time.sleep(3600)


@plugin.task("pytasks.hardstop", max_attempts=2, timeout=0.5, hard_stop=True)
def hardstop(ctx, payload):
    """Its first attempt ignores its timeout (and is killed); the next returns."""
    if ctx.attempt == 1:
        ctx.log("pid %d" % os.getpid())
        time.sleep(3600)
    return {"attempt": ctx.attempt, "pid": os.getpid()}


@plugin.task("pytasks.parent", max_attempts=1)
def parent(ctx, payload):
    """Submits pytasks.noop as its child, and a refused task."""
    child = ctx.submit("pytasks.noop", {"from": ctx.message_id})
    try:
        ctx.submit("pytasks.nosuchtask")
        refused = ""
    except th.SubmitRefused as e:
        refused = str(e)
    return {"child": child.id, "refused": refused}


@plugin.task("pytasks.retry_after", max_attempts=2)
def retry_after(ctx, payload):
    """Fails its first attempt asking for a retry no sooner than {"seconds": s}."""
    if ctx.attempt == 1:
        raise th.RetryAfter(payload["seconds"], "come back later")
    return {"attempt": ctx.attempt}


@plugin.task("pytasks.aio", max_attempts=1)
async def aio(ctx, payload):
    """An async def: sleeps {"ms": m} on the plugin's event loop."""
    await asyncio.sleep(payload.get("ms", 10) / 1000.0)
    ctx.log("awake")
    return {"slept_ms": payload.get("ms", 10)}


@plugin.task("pytasks.stubborn", max_attempts=1)
def stubborn(ctx, payload):
    """Ignores cancellation, with no timeout."""
    ctx.log("stubborn")
    time.sleep(3600)


@plugin.task("pytasks.notjson", max_attempts=1)
def notjson(ctx, payload):
    """Returns a value json cannot encode."""
    return {"a set": {1, 2}}


@plugin.task("pytasks.rawbad", max_attempts=1)
def rawbad(ctx, payload):
    """Returns text that is not JSON as if it were."""
    return th.RawJSON(b"{not json")


@plugin.task("pytasks.raise", max_attempts=1)
def raise_task(ctx, payload):
    """Raises an ordinary exception."""
    return {}["missing"]


if __name__ == "__main__":
    plugin.serve()
