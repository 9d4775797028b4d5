package e2e

// RabbitMQ restarted under the rabbitmq broker, on a private node of its
// own (the machine's shared RabbitMQ is never restarted: other tests use
// it meanwhile).

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// rabbitNode is a private RabbitMQ node: its own name, ports, data and
// logs in a temporary directory, started and stopped by the test.
type rabbitNode struct {
	url    string
	name   string
	dir    string
	env    []string
	server string
	cmd    *exec.Cmd
	exited chan struct{}
	log    *syncBuffer
}

// rabbitServer is the RabbitMQ start script itself: Debian's
// /usr/sbin/rabbitmq-server hands over to user rabbitmq, with its own
// environment, so the node would not be private.
func rabbitServer(tb testing.TB) string {
	tb.Helper()
	for _, p := range []string{"/usr/lib/rabbitmq/bin/rabbitmq-server"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, err := exec.LookPath("rabbitmq-server")
	if err != nil {
		tb.Fatalf("the RabbitMQ restart test starts a private RabbitMQ node, and rabbitmq-server is not installed: apt-get install -y rabbitmq-server (or make test/setup)")
	}
	return p
}

func freePort(tb testing.TB) int {
	tb.Helper()
	_, port, err := net.SplitHostPort(freeAddr(tb))
	if err != nil {
		tb.Fatal(err)
	}
	n, _ := strconv.Atoi(port)
	return n
}

// startRabbitNode starts a private node and waits until it takes AMQP
// connections; it is stopped at cleanup.
func startRabbitNode(tb testing.TB) *rabbitNode {
	tb.Helper()
	dir, err := os.MkdirTemp("", "taskhost-rabbit-")
	if err != nil {
		tb.Fatal(err)
	}
	port, dist := freePort(tb), freePort(tb)
	n := &rabbitNode{
		url:    fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", port),
		name:   fmt.Sprintf("taskhost-fault-%d@localhost", os.Getpid()),
		dir:    dir,
		server: rabbitServer(tb),
	}
	conf := fmt.Sprintf("listeners.tcp.1 = 127.0.0.1:%d\n", port)
	for name, body := range map[string]string{"rabbitmq.conf": conf, "enabled_plugins": ""} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	n.env = append(os.Environ(),
		"HOME="+dir, // the Erlang cookie
		"RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_DIST_PORT="+strconv.Itoa(dist),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "rabbitmq-env.conf"), // none: not the machine's
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "pid"),
	)
	tb.Cleanup(func() {
		n.stop(tb)
		if tb.Failed() {
			tb.Logf("private RabbitMQ node %s, output:\n%s", n.name, n.log.String())
		}
		os.RemoveAll(dir)
	})
	n.start(tb)
	return n
}

// start runs the node on its data directory (again, after stop) and waits
// until it takes connections.
func (n *rabbitNode) start(tb testing.TB) {
	tb.Helper()
	if n.log == nil {
		n.log = &syncBuffer{}
	}
	n.cmd = exec.Command(n.server)
	n.cmd.Dir = n.dir
	n.cmd.Env = n.env
	n.cmd.Stdout = n.log
	n.cmd.Stderr = n.log
	if err := n.cmd.Start(); err != nil {
		tb.Fatalf("start a private RabbitMQ node: %v", err)
	}
	exited := make(chan struct{})
	n.exited = exited
	go func(cmd *exec.Cmd) {
		_ = cmd.Wait()
		close(exited)
	}(n.cmd)
	waitFor(tb, 3*time.Minute, "the private RabbitMQ node "+n.name+" takes connections", func() bool {
		select {
		case <-exited:
			tb.Fatalf("the private RabbitMQ node exited while starting:\n%s", n.log.String())
		default:
		}
		c, err := amqp.DialConfig(n.url, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	})
}

// stop sends the node SIGTERM (its script stops it cleanly) and waits for
// it to exit, killing it after a minute. Stopping a stopped node does
// nothing.
func (n *rabbitNode) stop(tb testing.TB) {
	if n.cmd == nil {
		return
	}
	select {
	case <-n.exited:
		return
	default:
	}
	if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		tb.Errorf("SIGTERM to the private RabbitMQ node: %v", err)
	}
	select {
	case <-n.exited:
	case <-time.After(time.Minute):
		tb.Errorf("the private RabbitMQ node did not stop within a minute of SIGTERM; killing it")
		_ = n.cmd.Process.Kill()
		<-n.exited
	}
}

// healthStatus reads the status of p's tasks_worker /api/health ("" when
// it does not answer).
func (p *hostProc) healthStatus() string {
	var h struct {
		Status string `json:"status"`
	}
	if _, err := callWith(sampleClient, "GET", p.api("/health"), nil, &h); err != nil {
		return ""
	}
	return h.Status
}

// TestRabbitMQRestartLosesNoTask: two hosts burn down tasks on a private
// RabbitMQ node, which is stopped (SIGTERM) in the middle and started
// again on the same data. Meanwhile both hosts say they are degraded,
// tasks submitted during the outage are taken, and afterwards the brokers
// reconnect on their own: every task taken, before or during the outage,
// ends done (at least once).
func TestRabbitMQRestartLosesNoTask(t *testing.T) {
	const total = 600
	node := startRabbitNode(t)
	env := newRabbitEnv(t, node.url, "burn")
	cfg := env.config(twOpts{topics: "{burn: {}}"})
	hosts := []*hostProc{startHost(t, cfg), startHost(t, cfg)}
	restarts := make([]int, len(hosts)) // before the outage
	for i, h := range hosts {
		h.pluginPID(t, 0)
		restarts[i] = h.worker(t).Restarts
	}

	items := make([]map[string]any, total)
	for i := range items {
		items[i] = map[string]any{"task": "demo.sleep", "topic": "burn", "payload": map[string]any{"seconds": 0.1}}
	}
	var batch struct {
		IDs []string `json:"ids"`
	}
	if _, err := call("POST", hosts[0].api("/tasks/batch"), items, &batch); err != nil || len(batch.IDs) != total {
		t.Fatalf("batch submit: %d ids, %v", len(batch.IDs), err)
	}
	ids := batch.IDs
	waitFor(t, 2*time.Minute, "the burn-down is under way (the 50th task done, tasks still queued)", func() bool {
		m, err := hosts[0].task(ids[50])
		if err != nil || m.State != "done" {
			return false
		}
		tp, ok, err := hosts[0].topic("burn")
		return err == nil && ok && tp.Queued > 0
	})

	node.stop(t)
	for i, h := range hosts {
		waitFor(t, time.Minute, fmt.Sprintf("host %d says it is degraded while RabbitMQ is down", i), func() bool {
			return h.healthStatus() == "degraded"
		})
	}
	// Submits during the outage: each one answered is a task to run.
	var during []string
	for i := range 5 {
		id, err := hosts[i%2].submit("demo.echo", "burn", map[string]any{"during": i})
		if err == nil {
			during = append(during, id)
		} else {
			t.Logf("submit during the outage refused: %v", err)
		}
	}
	node.start(t)
	for i, h := range hosts {
		waitFor(t, 2*time.Minute, fmt.Sprintf("host %d is ok again after RabbitMQ came back", i), func() bool {
			return h.healthStatus() == "ok"
		})
	}

	waitFor(t, 5*time.Minute, "topic burn has nothing queued or running", func() bool {
		tp, ok, err := hosts[0].topic("burn")
		return err == nil && ok && tp.Queued == 0 && tp.Running == 0
	})
	var left []string
	for _, id := range append(append([]string{}, ids...), during...) {
		if m, err := hosts[0].task(id); err != nil || m.State != "done" {
			left = append(left, fmt.Sprintf("%s:%s(%v)", id, m.State, err))
		}
	}
	if len(left) > 0 {
		t.Fatalf("%d of %d tasks are not done after RabbitMQ restarted: %s", len(left), len(ids)+len(during), strings.Join(left[:min(len(left), 20)], " "))
	}
	t.Logf("%d tasks done, %d of them submitted while RabbitMQ was down", len(ids)+len(during), len(during))
	for i, h := range hosts {
		if st := h.worker(t); st.Restarts != restarts[i] {
			t.Errorf("host %d restarted tasks_worker %d time(s) during the outage: the broker must reconnect, not the plugin die (last error %q)", i, st.Restarts-restarts[i], st.LastError)
		}
	}
}
