"""Logs as the host reads them: one hclog JSON object a line on stderr.

The host (go-plugin) parses each stderr line of a plugin: a JSON object
with "@level", "@message" and "@timestamp" (in hclog's format) is logged
again at its level under the plugin's name, its other keys as fields.
Any other line is kept at debug level, and the last one is quoted when
the plugin fails to start.
"""

import datetime
import json
import logging
import os
import threading

_LEVELS = {
    "trace": 5,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

# Attributes every logging.LogRecord has; the others are the caller's
# fields (logger.info("msg", extra={"task": name})).
_formatter = logging.Formatter()
_RECORD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


# Objects whose locks a forked child (a hard_stop task) makes afresh: the
# thread that held one at the fork does not exist in the child.
_after_fork = []


def _reinit_locks():
    for obj in _after_fork:
        if hasattr(obj, "_write_lock"):
            obj._write_lock = threading.Lock()
        if hasattr(obj, "_lock"):
            obj._lock = threading.Lock()


os.register_at_fork(after_in_child=_reinit_locks)


def level_from_env(default=logging.INFO):
    """The level named by TASKHOST_LOG_LEVEL, which the host sets to its
    own (trace, debug, info, warn, error)."""
    return _LEVELS.get(os.environ.get("TASKHOST_LOG_LEVEL", "").strip().lower(), default)


def _hclog_level(levelno):
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warn"
    if levelno >= logging.INFO:
        return "info"
    if levelno >= logging.DEBUG:
        return "debug"
    return "trace"


def timestamp(t=None):
    """hclog's timestamp: 2006-01-02T15:04:05.000000Z07:00, in UTC."""
    dt = datetime.datetime.fromtimestamp(t, datetime.timezone.utc) if t is not None else datetime.datetime.now(datetime.timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def format_line(level, message, module="", t=None, **fields):
    """One hclog JSON line (with its newline) for the host."""
    obj = {"@level": level, "@message": message, "@timestamp": timestamp(t)}
    if module:
        obj["@module"] = module
    for k, v in fields.items():
        if k.startswith("@"):
            k = "_" + k
        obj[k] = v
    return json.dumps(obj, default=str, ensure_ascii=False) + "\n"


class HclogHandler(logging.Handler):
    """A logging handler writing hclog JSON lines to a file descriptor
    (2, the process's stderr, by default), whole lines at a time."""

    def __init__(self, module="", fd=2, level=logging.NOTSET):
        super().__init__(level)
        self.module = module
        self.fd = fd
        self._write_lock = threading.Lock()
        _after_fork.append(self)

    def emit(self, record):
        try:
            fields = {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRS}
            if record.exc_info:
                fields["error"] = _formatter.formatException(record.exc_info)
            elif record.exc_text:
                fields["error"] = record.exc_text
            line = format_line(_hclog_level(record.levelno), record.getMessage(), self.module, record.created, **fields)
            data = line.encode("utf-8", "replace")
            with self._write_lock:
                while data:
                    n = os.write(self.fd, data)
                    data = data[n:]
        except Exception:  # a logger never raises into its caller
            self.handleError(record)


def setup(module, fd=2):
    """Sends the root logger (so every logging.getLogger) to fd as hclog
    JSON at the host's level, and returns the plugin's logger."""
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, HclogHandler):
            root.removeHandler(h)
    root.addHandler(HclogHandler(module, fd))
    root.setLevel(level_from_env())
    return logging.getLogger(module)


class StderrLines:
    """Stands in for sys.stderr once the plugin serves: each line written
    (a print(file=sys.stderr), a thread's traceback) goes out as an hclog
    JSON line whose message is that line. Never as it is: the host takes a
    JSON line on stderr for a log entry, and one whose "@message" or
    "@level" is not a string made older hosts (go-plugin's parser) panic."""

    def __init__(self, module, fd=2, level="warn"):
        self.module = module
        self.fd = fd
        self.level = level
        self.encoding = "utf-8"
        self.errors = "replace"
        self._buf = ""
        self._lock = threading.Lock()
        _after_fork.append(self)

    def write(self, s):
        if not isinstance(s, str):
            s = str(s)
        with self._lock:
            self._buf += s
            lines = self._buf.split("\n")
            self._buf = lines.pop()
            for line in lines:
                self._emit(line)
        return len(s)

    def _emit(self, line):
        if not line:
            return
        data = format_line(self.level, line, self.module, stream="stderr").encode("utf-8", "replace")
        while data:
            data = data[os.write(self.fd, data):]

    def flush(self):
        with self._lock:
            if self._buf:
                self._emit(self._buf)
                self._buf = ""

    def isatty(self):
        return False

    def writable(self):
        return True

    def fileno(self):
        return self.fd
