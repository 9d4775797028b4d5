"""pyexample: a task plugin written in Python, with three tasks.

Pack it with the SDK into one executable file and put it in the host's
plugins directory (see examples/python/README.md):

    make build/python      # writes bin/plugins/fp-plugin-pyexample
"""

import taskhost_plugin as th

plugin = th.Plugin("pyexample", version="1.0.0")


@plugin.task("pyexample.greet", max_attempts=3, timeout=30)
def greet(ctx, payload):
    """Greets {"name": "..."}, in steps: logs each, reports progress, returns the greeting."""
    name = payload.get("name") if isinstance(payload, dict) else None
    if not isinstance(name, str) or not name:
        # Bad input never gets better: no retry.
        raise th.Permanent('the payload must be {"name": "..."}')
    words = ["hello,", name]
    for i, word in enumerate(words, 1):
        ctx.log("step %d of %d: %s" % (i, len(words), word))
        ctx.progress(i / len(words))
        if ctx.wait(0.05):  # True when the attempt is cancelled meanwhile
            raise th.TaskError("cancelled while greeting")
    return {"greeting": "hello, " + name, "attempt": ctx.attempt}


@plugin.task("pyexample.flaky", max_attempts=5, timeout=30)
def flaky(ctx, payload):
    """Fails its first {"fail": n} attempts (default 1), then succeeds; with {"not_before": unix_time} it snoozes until then first."""
    payload = payload if isinstance(payload, dict) else {}
    not_before = payload.get("not_before")
    if not_before is not None:
        import time

        wait = float(not_before) - time.time()
        if wait > 0:
            # Runs again after wait seconds; the attempt is not counted.
            raise th.Snooze(wait, "not before %s: waiting %.1f s" % (not_before, wait))
    fail = int(payload.get("fail", 1))
    if ctx.attempt <= fail:
        ctx.log("attempt %d: failing on purpose (%d to fail)" % (ctx.attempt, fail))
        raise th.TaskError("attempt %d failed on purpose" % ctx.attempt)
    ctx.log("attempt %d: succeeding" % ctx.attempt)
    return {"succeeded_at_attempt": ctx.attempt}


@plugin.task("pyexample.fanout", max_attempts=5, timeout=30)
def fanout(ctx, payload):
    """Greets each of {"names": [...]} in a task of its own, submitted as this task's children."""
    names = payload.get("names") if isinstance(payload, dict) else None
    if not isinstance(names, list) or not names:
        raise th.Permanent('the payload must be {"names": ["...", ...]}')
    try:
        # All or none; each child's parent_task_id is this task's id.
        children = ctx.submit_many([{"task": "pyexample.greet", "payload": {"name": n}} for n in names])
    except th.HostUnavailable as e:
        # The task system is starting or stopping: try again in a while.
        raise th.RetryAfter(10, "cannot submit now: %s" % e)
    ctx.log("submitted %d greetings" % len(children))
    return {"children": [c.id for c in children]}


if __name__ == "__main__":
    plugin.serve()
