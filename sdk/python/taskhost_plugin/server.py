"""Serving a plugin to the host: what go-plugin's Serve does for a Go plugin.

1. The magic cookie: without FP_PLUGIN_MAGIC_COOKIE the binary was run by
   hand; it says so on stderr and exits 1.
2. A gRPC server on a Unix socket, with mutual TLS when the host sends its
   certificate (PLUGIN_CLIENT_CERT, AutoMTLS): a self-signed certificate is
   made for this process, and the host must present its own.
3. The handshake line on stdout, the only thing ever written there:
   CORE|APP|unix|ADDRESS|grpc|CERT, CERT being the certificate's DER in
   unpadded base64. File descriptor 1 is then a pipe whose output goes to
   the host through GRPCStdio: stray print()s show up in the host's log as
   a warning, as a Go plugin's do.
4. The services: grpc.health.v1 (SERVING for "plugin"), GRPCController
   (Shutdown), GRPCStdio, GRPCBroker (through which the host offers its
   services: plugin.host, ctx.host), and taskhost's Lifecycle and
   TaskProvider.
5. Stopping: Lifecycle.Stop drains the running tasks within the host's
   deadline; Shutdown (or SIGTERM, or the host process going away) makes
   the process exit promptly.
"""

import base64
import datetime
import json
import os
import queue
import signal
import sys
import tempfile
import threading
import time
import uuid
from concurrent import futures

import grpc

from . import errors
from . import log as hclog
from .pb import grpc_broker_pb2_grpc, grpc_controller_pb2, grpc_controller_pb2_grpc
from .pb import grpc_stdio_pb2, grpc_stdio_pb2_grpc, health_pb2, health_pb2_grpc
from .pb import plugin_pb2 as pb
from .pb import plugin_pb2_grpc as pbg
from .host import HostServices
from .plugin import PROTOCOL_VERSION, Run
from .runner import Runner, TaskStream

MAGIC_COOKIE_KEY = "FP_PLUGIN_MAGIC_COOKIE"
MAGIC_COOKIE_VALUE = "7d0c2f5e-taskhost-plugin-3b9a41c6e8f24d17"
CORE_PROTOCOL_VERSION = 1
CHECK_CONFIG_ARG = "check-config"
CHECK_CONFIG_OK, CHECK_CONFIG_UNSUPPORTED, CHECK_CONFIG_INVALID = 0, 3, 4
MAX_MESSAGE_BYTES = 64 << 20
# How long a stop drains running tasks when nobody gives a deadline
# (SIGTERM, or the host went away): the Go SDK's orphan stop timeout.
DEFAULT_STOP_SECONDS = 30.0

NOT_A_PLUGIN = (
    "This binary is a plugin. These are not meant to be executed directly.\n"
    "Please execute the program that consumes these plugins, which will\n"
    "load any plugins automatically\n"
)


def make_certificate():
    """A self-signed certificate for localhost, as go-plugin makes one:
    returns (cert PEM, key PEM, cert DER)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "taskhost"), x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(seconds=30))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_encipherment=True, key_agreement=True, key_cert_sign=True,
                content_commitment=False, data_encipherment=False, crl_sign=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return cert_pem, key_pem, cert.public_bytes(serialization.Encoding.DER)


def handshake_line(app_version, network, address, cert_der=b""):
    cert = base64.b64encode(cert_der).decode().rstrip("=") if cert_der else ""
    return "%d|%d|%s|%s|grpc|%s\n" % (CORE_PROTOCOL_VERSION, app_version, network, address, cert)


def app_version(env):
    """The app protocol version: the host lists those it speaks in
    PLUGIN_PROTOCOL_VERSIONS; this SDK speaks only PROTOCOL_VERSION, and
    answers it whatever the list (the host then says they differ)."""
    return PROTOCOL_VERSION


class State:
    """What the services share: the running attempts, and stopping."""

    def __init__(self, plugin, logger):
        self.plugin = plugin
        self.logger = logger
        self.lock = threading.Condition()
        self.running = {}  # id -> Run: attempts of RunTask calls whose handler runs
        self.calls = 0  # RunTask calls not ended (their final event may not be sent yet)
        # The attempts of streams (RunTasks), and the threads they run on.
        self.runner = Runner(plugin, logger, lambda: plugin.host)
        self.stopping = False
        self.shutdown = False  # the host's Shutdown: exit now
        self.exit = threading.Event()
        self.stdio = queue.Queue(maxsize=1000)
        self.conn_infos = {}  # broker id -> ConnInfo, from the host
        self.host_credentials = None  # for dialing the host's services

    def conn_info(self, service_id, timeout):
        """The broker's connection info for service_id, waiting up to
        timeout seconds for the host to send it."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while service_id not in self.conn_infos:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.lock.wait(left)
            return self.conn_infos[service_id]

    def drain(self, seconds):
        """Refuses new attempts, waits up to seconds for the running ones,
        then tells the ones left that they are cancelled."""
        deadline = time.monotonic() + max(0.0, seconds)
        runner = self.runner
        runner.stopping = True
        with self.lock:
            self.stopping = True
            while self.running or self.calls or runner.pending():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.lock.wait(min(left, 0.05))
            left_running = list(self.running.values())
        for r in left_running:
            r.ctx.cancel()
        with runner.lock:
            streams = list(runner.streams)
        n = len(left_running)
        for s in streams:
            for att in list(s.running.values()):
                runner.cancel(att, "the plugin stops")
                n += 1
        if n:
            self.logger.warning("stopping with tasks still running; they are cancelled", extra={"running": n})
        return not n


class Lifecycle(pbg.LifecycleServicer):
    def __init__(self, st):
        self.st = st

    def Describe(self, request, context):
        caps = ["lifecycle", "tasks"]
        if self.st.plugin.stream:
            caps.append("tasks_stream")
        return pb.DescribeResponse(
            name=self.st.plugin.name, version=self.st.plugin.version, api_versions=[PROTOCOL_VERSION],
            capabilities=caps, pid=os.getpid(),
        )

    def Configure(self, request, context):
        st = self.st
        if st.plugin.host is not None:
            st.plugin.host.close()
        bid = request.host_broker_id
        st.plugin.host = HostServices(lambda timeout: st.conn_info(bid, timeout), st.host_credentials)
        try:
            self.st.plugin.configure(request.config_json)
        except errors.InvalidConfig as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, e.text())
        except Exception as e:
            self.st.logger.exception("configure failed")
            context.abort(grpc.StatusCode.UNKNOWN, "%s: %s" % (type(e).__name__, e))
        return pb.ConfigureResponse()

    def CheckHealth(self, request, context):
        S = pb.CheckHealthResponse
        try:
            msg = self.st.plugin.health()
        except Exception as e:
            return S(status=S.STATUS_ERROR, message="%s: %s" % (type(e).__name__, e))
        if msg:
            return S(status=S.STATUS_DEGRADED, message=str(msg))
        return S(status=S.STATUS_OK, message=self.st.runner.health_message())

    def Stop(self, request, context):
        left = context.time_remaining()
        seconds = DEFAULT_STOP_SECONDS if left is None else max(0.0, left - 0.5)
        self.st.drain(seconds)
        self.st.plugin.stopped()
        return pb.StopResponse()


class TaskProvider(pbg.TaskProviderServicer):
    def __init__(self, st):
        self.st = st

    def ListTasks(self, request, context):
        return pb.ListTasksResponse(tasks=[t.spec() for t in self.st.plugin.tasks.values()])

    def RunTask(self, request, context):
        st = self.st
        task = st.plugin.tasks.get(request.task)
        if task is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "plugin %s has no task %r" % (st.plugin.name, request.task))
        key = object()

        def ended():
            with st.lock:
                st.running.pop(key, None)
                st.lock.notify_all()

        run = Run(task, request, st.plugin.config, st.logger, st.plugin.host, on_end=ended)
        with st.lock:
            if st.stopping:
                context.abort(grpc.StatusCode.UNAVAILABLE, "plugin %s is stopping" % st.plugin.name)
            if len(st.running) >= st.plugin.max_tasks:
                context.abort(grpc.StatusCode.UNAVAILABLE, "plugin %s runs its limit of %d tasks at once" % (st.plugin.name, st.plugin.max_tasks))
            st.running[key] = run
            st.calls += 1
        # The host cancels the call when the worker gives up the attempt.
        context.add_callback(run.abort)
        try:
            for ev in run.events():
                yield ev
        finally:
            if not run.started:
                run.ended()
            with st.lock:
                st.calls -= 1
                st.lock.notify_all()

    def RunTasks(self, request_iterator, context):
        st = self.st
        if not st.plugin.stream:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "plugin %s runs its tasks one call each (RunTask)" % st.plugin.name)
        if st.stopping:
            context.abort(grpc.StatusCode.UNAVAILABLE, "plugin %s is stopping" % st.plugin.name)
        return TaskStream(st.runner, request_iterator, context).frames()


class Health(health_pb2_grpc.HealthServicer):
    def Check(self, request, context):
        if request.service in ("", "plugin"):
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
        context.abort(grpc.StatusCode.NOT_FOUND, "unknown service %r" % request.service)


class Controller(grpc_controller_pb2_grpc.GRPCControllerServicer):
    def __init__(self, st):
        self.st = st

    def Shutdown(self, request, context):
        self.st.logger.debug("shutdown requested by the host")
        self.st.shutdown = True
        self.st.exit.set()
        return grpc_controller_pb2.Empty()


class Stdio(grpc_stdio_pb2_grpc.GRPCStdioServicer):
    def __init__(self, st):
        self.st = st

    def StreamStdio(self, request, context):
        while context.is_active():
            try:
                data = self.st.stdio.get(timeout=0.5)
            except queue.Empty:
                continue
            yield grpc_stdio_pb2.StdioData(channel=grpc_stdio_pb2.StdioData.STDOUT, data=data)


class Broker(grpc_broker_pb2_grpc.GRPCBrokerServicer):
    """go-plugin's broker: the host sends the address of each service it
    offers (its HostServices, at each Configure); the plugin offers none."""

    def __init__(self, st):
        self.st = st

    def StartStream(self, request_iterator, context):
        for info in request_iterator:
            with self.st.lock:
                self.st.conn_infos[info.service_id] = info
                self.st.lock.notify_all()
        return
        yield  # a stream that sends nothing


def _capture_stdout(st):
    """Points file descriptor 1 (and so print()) at a pipe read into
    st.stdio, and returns a descriptor of the real stdout."""
    sys.stdout.flush()
    real = os.dup(1)
    r, w = os.pipe()
    os.dup2(w, 1)
    os.close(w)

    def pump():
        while True:
            try:
                data = os.read(r, 32 << 10)
            except OSError:
                return
            if not data:
                return
            try:
                st.stdio.put_nowait(data)
            except queue.Full:  # nobody reads: drop, never block print()
                pass

    threading.Thread(target=pump, name="stdout", daemon=True).start()
    return real


def _check_config(plugin):
    if plugin._config_check is None:
        return CHECK_CONFIG_UNSUPPORTED
    raw = sys.stdin.buffer.read(64 << 20)
    try:
        cfg = json.loads(raw) if raw.strip() else {}
        plugin._config_check(cfg if cfg is not None else {})
    except errors.InvalidConfig as e:
        sys.stdout.write(json.dumps({"key": e.key, "problem": e.problem}) + "\n")
        return CHECK_CONFIG_INVALID
    except ValueError as e:
        sys.stdout.write(json.dumps({"key": "", "problem": "the config block is not JSON: %s" % e}) + "\n")
        return CHECK_CONFIG_INVALID
    return CHECK_CONFIG_OK


def _listen_address():
    d = os.environ.get("PLUGIN_UNIX_SOCKET_DIR") or tempfile.gettempdir()
    return os.path.join(d, "plugin-py-" + uuid.uuid4().hex[:16])


def serve(plugin):
    """Runs plugin for the host until it is told to stop; returns the exit
    status. See the module's doc for the steps."""
    if len(sys.argv) == 2 and sys.argv[1] == CHECK_CONFIG_ARG:
        code = _check_config(plugin)
        sys.stdout.flush()
        os._exit(code)
    if os.environ.get(MAGIC_COOKIE_KEY) != MAGIC_COOKIE_VALUE:
        sys.stderr.write(NOT_A_PLUGIN)
        sys.stderr.flush()
        os._exit(1)

    logger = hclog.setup(plugin.name)
    plugin.logger = logger
    sys.stderr.flush()
    sys.stderr = hclog.StderrLines(plugin.name)
    st = State(plugin, logger)

    # go-plugin's plugins ignore SIGINT (a terminal's ^C reaches the whole
    # group); SIGTERM stops this one gracefully.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: st.exit.set())

    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    # Each running task holds a thread of the pool; the rest answer health
    # checks and the host's other calls.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=plugin.max_tasks + 16, thread_name_prefix="grpc"), options=options)
    pbg.add_LifecycleServicer_to_server(Lifecycle(st), server)
    pbg.add_TaskProviderServicer_to_server(TaskProvider(st), server)
    health_pb2_grpc.add_HealthServicer_to_server(Health(), server)
    grpc_controller_pb2_grpc.add_GRPCControllerServicer_to_server(Controller(st), server)
    grpc_stdio_pb2_grpc.add_GRPCStdioServicer_to_server(Stdio(st), server)
    grpc_broker_pb2_grpc.add_GRPCBrokerServicer_to_server(Broker(st), server)

    path = _listen_address()
    cert_der = b""
    client_cert = os.environ.get("PLUGIN_CLIENT_CERT", "")
    if client_cert:
        cert_pem, key_pem, cert_der = make_certificate()
        creds = grpc.ssl_server_credentials([(key_pem, cert_pem)], root_certificates=client_cert.encode(), require_client_auth=True)
        st.host_credentials = grpc.ssl_channel_credentials(client_cert.encode(), key_pem, cert_pem)
        bound = server.add_secure_port("unix:" + path, creds)
    else:
        bound = server.add_insecure_port("unix:" + path)
    if not bound:
        logger.error("cannot listen on a Unix socket", extra={"path": path})
        os._exit(1)
    server.start()

    real_stdout = _capture_stdout(st)
    line = handshake_line(app_version(os.environ), "unix", path, cert_der).encode()
    while line:
        line = line[os.write(real_stdout, line):]
    logger.debug("plugin address", extra={"network": "unix", "address": path, "tasks": len(plugin.tasks)})

    threading.Thread(target=_watch_parent, args=(st,), name="parent", daemon=True).start()
    # The main thread waits here, where signal handlers run.
    while not st.exit.wait(0.5):
        pass

    # Told to exit: by Shutdown (after Stop, which drained; a Shutdown
    # alone, like go-plugin's, does not wait: the host kills the process
    # 2 s after it), or by SIGTERM or the host's death (drain first).
    if not st.stopping:
        st.drain(0 if st.shutdown else DEFAULT_STOP_SECONDS)
        plugin.stopped()
    # The streams end with what they hold sent (their writers return),
    # not cut by the server's stop.
    with st.runner.lock:
        streams = list(st.runner.streams)
    for s in streams:
        s.close()
    server.stop(grace=0.5).wait(2)
    try:
        os.unlink(path)
    except OSError:
        pass
    logger.debug("plugin exits")
    sys.stderr.flush()
    os._exit(0)


def _watch_parent(st):
    """Exits when the host process goes away (the parent changes), so a
    host killed with SIGKILL leaves no plugin running."""
    import taskhost_plugin

    parent = taskhost_plugin.HOST_PID
    while not st.exit.wait(1.0):
        if os.getppid() != parent:
            st.logger.warning("host process is gone, stopping", extra={"old_parent": parent})
            st.exit.set()
            return
