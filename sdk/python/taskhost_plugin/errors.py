"""How a task's attempt ends when it does not return a result.

Raise one of these from a task (or any other exception, which counts as
TaskError). They mirror the Go SDK's outcomes: capability.Snooze,
capability.Permanent and capability.CancelTask.
"""

import math

# The longest snooze the brokers take (broker.MaxDelay: 365 days).
MAX_SNOOZE_SECONDS = 365 * 24 * 3600


class TaskError(Exception):
    """The attempt failed; it is retried after the task's backoff while
    attempts remain. Its message is the attempt's error as shown in the
    task's report. Any other exception a task raises is treated as a
    TaskError whose message starts with the exception's type."""


class RetryAfter(TaskError):
    """The attempt failed, and its retry must wait at least `seconds`
    (whatever the task's backoff says), e.g. for a rate limit:
    raise th.RetryAfter(30, "the API said 429"). Without attempts left the
    task fails as with TaskError. seconds must be a finite number from 0
    to MAX_SNOOZE_SECONDS; another value fails the attempt saying why."""

    def __init__(self, seconds, reason=""):
        self.seconds = seconds
        self.reason = reason
        super().__init__(reason or "retry after %s s" % (seconds,))


class Snooze(Exception):
    """Run the task again after `seconds`, without using an attempt.

    seconds must be a finite number from 0 to MAX_SNOOZE_SECONDS; any
    other value fails the attempt as an error would, saying why.
    """

    def __init__(self, seconds, reason=""):
        self.seconds = seconds
        self.reason = reason
        super().__init__(reason or "snoozed for %s s" % (seconds,))


class Permanent(Exception):
    """The attempt failed for good: no further attempt (the task ends
    dead when its topic keeps dead letters, failed otherwise)."""

    def __init__(self, reason="failed permanently"):
        super().__init__(reason)


class CancelTask(Exception):
    """The task cancels itself: it ends cancelled and is never retried."""

    def __init__(self, reason="cancelled by the task"):
        super().__init__(reason)


class InvalidConfig(Exception):
    """Raised by a configure hook for a config block the plugin cannot use:
    the host shows `plugins.<name>.config: <key>: <problem>` and does not
    restart the plugin until the config is fixed."""

    def __init__(self, problem, key=""):
        self.key = key
        self.problem = problem
        super().__init__(self.text())

    def text(self):
        if self.key:
            return "invalid config: %s: %s" % (self.key, self.problem)
        return "invalid config: " + self.problem


def check_snooze(seconds, what="a snooze"):
    """Returns the delay in seconds as a float, or raises ValueError
    saying why it is not valid (what names it: "a snooze", "a retry
    delay")."""
    if isinstance(seconds, bool):
        raise ValueError("%s is a number of seconds, not %r" % (what, seconds))
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        raise ValueError("%s is a number of seconds, not %r" % (what, seconds)) from None
    if not math.isfinite(s) or s < 0:
        raise ValueError("%s of %r s is not valid: give a number of seconds from 0 to %d" % (what, seconds, MAX_SNOOZE_SECONDS))
    if s > MAX_SNOOZE_SECONDS:
        raise ValueError("%s of %r s is longer than the limit of %d s (365 days)" % (what, seconds, MAX_SNOOZE_SECONDS))
    return s


class HostUnavailable(TaskError):
    """The host's services cannot be reached (the host offered none, or
    the connection failed), or the task system does not run (a submit
    while tasks_worker starts, stops or is not enabled). Uncaught in a
    task, it fails the attempt, which is retried."""


class SubmitRefused(TaskError, ValueError):
    """The task system refused a submit (an unknown task, a bad payload,
    topic, delay or unique key): nothing was queued. Its message says
    which task and why. Uncaught in a task, it fails the attempt."""
