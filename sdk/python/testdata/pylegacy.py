"""pylegacy: a plugin without the stream of attempts (stream=False), as
plugins built before it: tasks_worker runs each attempt with a RunTask
call of its own (stream_host_test.go)."""

import taskhost_plugin as th

plugin = th.Plugin("pylegacy", version="0.1.0", stream=False)


@plugin.task("pylegacy.echo", max_attempts=1)
def echo(ctx, payload):
    """Returns its payload and its attempt."""
    ctx.log("echo")
    return {"payload": payload, "attempt": ctx.attempt}


if __name__ == "__main__":
    plugin.serve()
