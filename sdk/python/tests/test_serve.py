"""The plugin process as go-plugin's host sees it: the magic cookie, the
handshake line, mutual TLS, the services, the hclog lines on stderr, and
a prompt exit on Shutdown. The host itself is exercised by host_test.go."""

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from taskhost_plugin import log as hclog
from taskhost_plugin import server
from taskhost_plugin.pb import grpc_controller_pb2, grpc_controller_pb2_grpc, grpc_stdio_pb2_grpc, health_pb2, health_pb2_grpc
from taskhost_plugin.pb import plugin_pb2 as pb
from taskhost_plugin.pb import plugin_pb2_grpc as pbg
from google.protobuf import empty_pb2

SDK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = os.path.join(SDK, "testdata", "pytasks.py")
# hclog's time layout, 2006-01-02T15:04:05.000000Z07:00, in UTC.
# gRPC's C core logs in its own format (GRPC_VERBOSITY): the host keeps
# such lines at debug level.
GRPC_CORE_LOG = re.compile(r"^[EWID]\d{4} \d\d:\d\d:\d\d")
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def start(env_extra, args=()):
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": SDK}
    env.update(env_extra)
    return subprocess.Popen([sys.executable, PLUGIN, *args], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def reap(p):
    """Kills p if it still runs, waits for it and closes its pipes."""
    if p.poll() is None:
        p.kill()
    p.wait()
    for f in (p.stdin, p.stdout, p.stderr):
        if f is not None:
            f.close()


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


class HelpersTest(unittest.TestCase):
    def test_handshake_line(self):
        line = server.handshake_line(1, "unix", "/tmp/plugin-x", b"\x01\x02\x03\x04")
        self.assertEqual(line, "1|1|unix|/tmp/plugin-x|grpc|AQIDBA\n")  # unpadded base64
        self.assertEqual(server.handshake_line(1, "tcp", "127.0.0.1:5", b""), "1|1|tcp|127.0.0.1:5|grpc|\n")

    def test_certificate(self):
        cert_pem, key_pem, der = server.make_certificate()
        cert = x509.load_pem_x509_certificate(cert_pem)
        self.assertEqual(cert.public_bytes(serialization.Encoding.DER), der)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        self.assertEqual(san.get_values_for_type(x509.DNSName), ["localhost"])
        self.assertTrue(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
        self.assertIn(b"PRIVATE KEY", key_pem)

    def test_log_line(self):
        line = hclog.format_line("warn", "hello", "mod", 0, task="t", **{"@level": "x"})
        obj = json.loads(line)
        self.assertTrue(line.endswith("\n") and line.count("\n") == 1)
        self.assertEqual((obj["@level"], obj["@message"], obj["@module"], obj["task"], obj["_@level"]), ("warn", "hello", "mod", "t", "x"))
        self.assertEqual(obj["@timestamp"], "1970-01-01T00:00:00.000000Z")
        self.assertRegex(hclog.timestamp(), TIMESTAMP)

    def test_log_handler(self):
        r, w = os.pipe()
        import logging

        lg = logging.getLogger("handler-test")
        lg.propagate = False
        lg.addHandler(hclog.HclogHandler("m", fd=w))
        lg.setLevel(logging.DEBUG)
        lg.info("multi\nline", extra={"k": 1})
        try:
            raise ValueError("boom")
        except ValueError:
            lg.exception("failed")
        os.close(w)
        with os.fdopen(r) as f:
            lines = f.read().splitlines()
        self.assertEqual(len(lines), 2)
        a, b = json.loads(lines[0]), json.loads(lines[1])
        self.assertEqual((a["@level"], a["@message"], a["k"]), ("info", "multi\nline", 1))
        self.assertEqual(b["@level"], "error")
        self.assertIn("ValueError: boom", b["error"])


class ServeTest(unittest.TestCase):
    def test_run_by_hand(self):
        p = start({})
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertEqual(out, b"")
        self.assertIn(b"This binary is a plugin", err)

    def test_check_config(self):
        for block, code, out in [
            (b"{}", server.CHECK_CONFIG_OK, {}),
            (b"", server.CHECK_CONFIG_OK, {}),
            (b'{"color": "green"}', server.CHECK_CONFIG_INVALID, {"key": "color", "problem": "must be red or blue"}),
            (b"{nope", server.CHECK_CONFIG_INVALID, None),
        ]:
            p = start({}, ["check-config"])
            stdout, _ = p.communicate(block, timeout=60)
            self.assertEqual(p.returncode, code, block)
            if out == {}:
                self.assertEqual(stdout, b"")
            elif out is not None:
                self.assertEqual(json.loads(stdout), out)
            else:
                self.assertIn("not JSON", json.loads(stdout)["problem"])

    def connect(self, p, host_cert, host_key):
        """Reads the handshake of p and returns a channel to it."""
        parts = p.stdout.readline().decode().rstrip("\n").split("|")
        der = base64.b64decode(parts[5] + "=" * (-len(parts[5]) % 4))
        plugin_cert = x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM)
        creds = grpc.ssl_channel_credentials(plugin_cert, host_key, host_cert)
        ch = grpc.secure_channel("unix:" + parts[3], creds, [("grpc.ssl_target_name_override", "localhost")])
        self.addCleanup(ch.close)
        return ch

    def test_without_mtls(self):
        # A host without AutoMTLS sends no certificate: no TLS, and the
        # handshake's sixth field is empty.
        p = start({server.MAGIC_COOKIE_KEY: server.MAGIC_COOKIE_VALUE})
        self.addCleanup(reap, p)
        threading.Thread(target=p.stderr.read, daemon=True).start()
        parts = p.stdout.readline().decode().rstrip("\n").split("|")
        self.assertEqual((len(parts), parts[5]), (6, ""))
        ch = grpc.insecure_channel("unix:" + parts[3])
        self.addCleanup(ch.close)
        d = pbg.LifecycleStub(ch).Describe(pb.DescribeRequest(), timeout=30)
        self.assertEqual(d.name, "pytasks")
        # A Shutdown without Stop (go-plugin's Kill) does not wait for the
        # running tasks (a SIGTERM would drain them for 30 s).
        stuck = pbg.TaskProviderStub(ch).RunTask(pb.RunTaskRequest(task="pytasks.stubborn", attempt=1), timeout=120)
        self.assertEqual(next(stuck).log_line, "stubborn")
        grpc_controller_pb2_grpc.GRPCControllerStub(ch).Shutdown(grpc_controller_pb2.Empty(), timeout=10)
        self.assertEqual(p.wait(timeout=20), 0)

    def test_sigterm_drains_running_tasks(self):
        host_cert, host_key, _ = server.make_certificate()
        p = start({server.MAGIC_COOKIE_KEY: server.MAGIC_COOKIE_VALUE, "PLUGIN_CLIENT_CERT": host_cert.decode()})
        self.addCleanup(reap, p)
        threading.Thread(target=p.stderr.read, daemon=True).start()
        ch = self.connect(p, host_cert, host_key)
        stream = pbg.TaskProviderStub(ch).RunTask(pb.RunTaskRequest(task="pytasks.count", payload_json=b'{"to": 20, "step_ms": 50}', attempt=1), timeout=60)
        first = next(stream)  # the task runs
        self.assertTrue(first.has_progress)
        p.send_signal(signal.SIGTERM)
        evs = list(stream)
        self.assertEqual(evs[-1], pb.RunTaskEvent(done=True, result_json=b'{"counted":20}'))
        self.assertEqual(p.wait(timeout=30), 0)

    def test_sigterm_drains_the_stream(self):
        host_cert, host_key, _ = server.make_certificate()
        p = start({server.MAGIC_COOKIE_KEY: server.MAGIC_COOKIE_VALUE, "PLUGIN_CLIENT_CERT": host_cert.decode()})
        self.addCleanup(reap, p)
        threading.Thread(target=p.stderr.read, daemon=True).start()
        ch = self.connect(p, host_cert, host_key)
        frames = [pb.TaskDispatch(attempts=[pb.TaskAttempt(id=1, task="pytasks.count", payload_json=b'{"to": 20, "step_ms": 50}', attempt=1)])]
        gate = threading.Event()

        def dispatches():
            yield frames[0]
            gate.wait(60)  # the caller keeps its side open

        stream = pbg.TaskProviderStub(ch).RunTasks(dispatches(), timeout=60)
        self.assertEqual(next(stream).capacity, 64)
        first = next(stream)  # the task runs
        self.assertTrue(first.events[0].event.has_progress)
        p.send_signal(signal.SIGTERM)
        final = None
        for f in stream:  # ends once the plugin has sent what it holds
            for e in f.events:
                if e.event.done:
                    final = e
        gate.set()
        self.assertEqual(final, pb.TaskAttemptEvent(id=1, event=pb.RunTaskEvent(done=True, result_json=b'{"counted":20}')))
        self.assertEqual(p.wait(timeout=30), 0)

    def test_exits_when_the_host_dies(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        pidfile = os.path.join(d, "pid")
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": SDK, server.MAGIC_COOKIE_KEY: server.MAGIC_COOKIE_VALUE}
        # A stand-in host: a shell that starts the plugin and waits.
        out = os.path.join(d, "stdout")
        sh = subprocess.Popen(["/bin/sh", "-c", '"$0" "$1" >"$3" 2>/dev/null & echo $! > "$2.tmp"; mv "$2.tmp" "$2"; wait', sys.executable, PLUGIN, pidfile, out],
                              env=env, start_new_session=True)
        self.addCleanup(lambda: sh.poll() is None and sh.kill())
        for _ in range(600):
            if os.path.exists(pidfile):
                break
            time.sleep(0.1)
        with open(pidfile) as f:
            pid = int(f.read())
        self.addCleanup(lambda: _kill(pid))
        for _ in range(600):  # until it serves: its handshake is written
            try:  # the shell may not have opened it yet
                with open(out) as f:
                    if f.read().endswith("\n"):
                        break
            except FileNotFoundError:
                pass
            time.sleep(0.1)
        sh.kill()
        sh.wait()
        for _ in range(600):
            if not _alive(pid):
                break
            time.sleep(0.1)
        self.assertFalse(_alive(pid), "the plugin still runs 60 s after its host died")

    def test_as_the_host_runs_it(self):
        host_cert, host_key, _ = server.make_certificate()
        p = start({
            server.MAGIC_COOKIE_KEY: server.MAGIC_COOKIE_VALUE,
            "PLUGIN_PROTOCOL_VERSIONS": "1",
            "PLUGIN_CLIENT_CERT": host_cert.decode(),
            "TASKHOST_LOG_LEVEL": "debug",
        })
        self.addCleanup(reap, p)
        stderr = []
        threading.Thread(target=lambda: stderr.extend(p.stderr.read().splitlines()), daemon=True).start()

        line = p.stdout.readline().decode()
        parts = line.rstrip("\n").split("|")
        self.assertEqual(parts[:3] + [parts[4]], ["1", "1", "unix", "grpc"], line)
        der = base64.b64decode(parts[5] + "=" * (-len(parts[5]) % 4))
        plugin_cert = x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM)

        opts = [("grpc.ssl_target_name_override", "localhost")]
        target = "unix:" + parts[3]

        # Without the host's certificate the plugin refuses the connection.
        _, other_key, _ = server.make_certificate()
        other_cert = server.make_certificate()
        stranger = grpc.secure_channel(target, grpc.ssl_channel_credentials(plugin_cert, other_cert[1], other_cert[0]), opts)
        with self.assertRaises(grpc.RpcError):
            health_pb2_grpc.HealthStub(stranger).Check(health_pb2.HealthCheckRequest(service="plugin"), timeout=10)
        stranger.close()

        ch = grpc.secure_channel(target, grpc.ssl_channel_credentials(plugin_cert, host_key, host_cert), opts)
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="plugin"), timeout=30)
        self.assertEqual(health.status, health_pb2.HealthCheckResponse.SERVING)

        stdio = grpc_stdio_pb2_grpc.GRPCStdioStub(ch).StreamStdio(empty_pb2.Empty())
        life = pbg.LifecycleStub(ch)
        d = life.Describe(pb.DescribeRequest(), timeout=10)
        self.assertEqual((d.name, d.version, list(d.api_versions), list(d.capabilities), d.pid), ("pytasks", "0.1.0", [1], ["lifecycle", "tasks", "tasks_stream"], p.pid))
        with self.assertRaises(grpc.RpcError) as cm:
            life.Configure(pb.ConfigureRequest(config_json=b'{"color": "green"}'), timeout=10)
        self.assertEqual((cm.exception.code(), cm.exception.details()), (grpc.StatusCode.FAILED_PRECONDITION, "invalid config: color: must be red or blue"))
        life.Configure(pb.ConfigureRequest(config_json=b'{"color": "blue"}'), timeout=10)
        self.assertEqual(life.CheckHealth(pb.CheckHealthRequest(), timeout=10).status, pb.CheckHealthResponse.STATUS_OK)

        tasks = pbg.TaskProviderStub(ch)
        names = [t.name for t in tasks.ListTasks(pb.ListTasksRequest(), timeout=10).tasks]
        self.assertIn("pytasks.count", names)
        evs = list(tasks.RunTask(pb.RunTaskRequest(task="pytasks.count", payload_json=b'{"to": 10, "step_ms": 1}', attempt=1), timeout=30))
        self.assertEqual(evs[-1], pb.RunTaskEvent(done=True, result_json=b'{"counted":10}'))
        self.assertEqual([e.log_line for e in evs if e.log_line], ["counted 10"])
        self.assertEqual(len([e for e in evs if e.has_progress]), 10)
        with self.assertRaises(grpc.RpcError) as cm:
            list(tasks.RunTask(pb.RunTaskRequest(task="nope"), timeout=10))
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)

        # A print reaches the host through GRPCStdio, never the handshake pipe.
        evs = list(tasks.RunTask(pb.RunTaskRequest(task="pytasks.print", attempt=1), timeout=30))
        self.assertEqual(evs[-1].result_json, b'{"printed":true}')
        data = next(stdio)
        self.assertEqual(data.data, b"a stray line from pytasks.print\n")

        # A call the host cancels frees its place at once, though its
        # handler still runs: Stop then finds nothing running.
        long = tasks.RunTask(pb.RunTaskRequest(task="pytasks.stubborn", attempt=1), timeout=120)
        self.assertEqual(next(long).log_line, "stubborn")
        long.cancel()

        # A line written to stderr directly is wrapped, never sent as it is.
        evs = list(tasks.RunTask(pb.RunTaskRequest(task="pytasks.stderr", attempt=1), timeout=30))
        self.assertEqual(evs[-1].result_json, b'{"written":true}')

        life.Stop(pb.StopRequest(), timeout=30)
        grpc_controller_pb2_grpc.GRPCControllerStub(ch).Shutdown(grpc_controller_pb2.Empty(), timeout=10)
        self.assertEqual(p.wait(timeout=10), 0)
        self.assertEqual(p.stdout.read(), b"", "the plugin wrote more than the handshake on its stdout")
        ch.close()
        time.sleep(0.2)
        levels, messages = set(), []
        for raw in stderr:
            if GRPC_CORE_LOG.match(raw.decode()):
                continue  # gRPC's own C logs (here: the stranger refused)
            try:
                obj = json.loads(raw)
            except ValueError:
                self.fail("a stderr line is not hclog JSON: %r" % raw)  # every stderr line is an hclog JSON object
            self.assertRegex(obj["@timestamp"], TIMESTAMP)
            self.assertEqual(obj["@module"], "pytasks")
            for k in ("@level", "@message", "@timestamp"):
                self.assertIsInstance(obj[k], str, raw)
            levels.add(obj["@level"])
            messages.append(obj["@message"])
        self.assertIn("debug", levels)
        self.assertFalse([m for m in messages if "still running" in m], messages)
        self.assertIn('{"@message": 1, "@level": 2, "@timestamp": 3}', messages)
        self.assertFalse(os.path.exists(parts[3]), "the socket file is left behind")


if __name__ == "__main__":
    unittest.main()
