package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const adminToken = "chaos-suite-admin-token-0123456789"

// env is what every scenario shares: the temporary directory, the
// network, PostgreSQL and the proxy.
type env struct {
	dir   string
	db    link
	pg    *pgCluster
	links []link        // one per host namespace
	px    []*pxListener // proxy listener of each host namespace
}

const dbName = "chaos"

func setup(t *testing.T, hosts int) *env {
	t.Helper()
	checkSubnetFree(t)
	dir, err := os.MkdirTemp("", tmpPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if keep {
			t.Logf("logs kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	e := &env{dir: dir, db: newLink("db", 0)}
	e.db.create(t)
	for i := range hosts {
		l := newLink(fmt.Sprintf("h%d", i+1), i+1)
		l.create(t)
		e.links = append(e.links, l)
	}
	e.pg = startPG(t, dir, e.db)
	c, err := e.pg.connect("postgres")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(context.Background(), "CREATE DATABASE "+dbName); err != nil {
		t.Fatal(err)
	}
	c.Close(context.Background())
	for i, l := range e.links {
		e.px = append(e.px, listen(t, fmt.Sprintf("h%d", i+1), fmt.Sprintf("%s:%d", l.rootIP, pxPort), fmt.Sprintf("%s:%d", e.db.nsIP, pgPort)))
	}
	return e
}

// host is one bin/host process in its namespace.
type host struct {
	name    string
	l       link
	base    string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// twSettings are the tasks_worker settings of every host: the defaults'
// timings scaled down so that a scenario takes seconds.
const twSettings = `
      workers: 4
      heartbeat_interval_seconds: 0.5
      orphan_reclaim_interval_seconds: 1
      orphan_reclaim_after_seconds: %d
      orphan_claim_grace_seconds: 1
      beat_lease_ttl_seconds: %d
      drain_timeout_seconds: 1
      topics: {lim: {concurrency_limit: %d}, free: {}}
`

const (
	reclaimAfter = 3 // orphan_reclaim_after_seconds
	leaseTTL     = 3 // beat_lease_ttl_seconds
	topicLimit   = 5 // concurrency_limit of topic lim
)

// startHosts starts one host per namespace on schema and waits until each
// one's tasks_worker answers.
func (e *env) startHosts(t *testing.T, schema string) []*host {
	t.Helper()
	hs := make([]*host, len(e.links))
	for i, l := range e.links {
		h := &host{name: fmt.Sprintf("h%d", i+1), l: l, base: fmt.Sprintf("http://%s:%d", l.nsIP, hPort)}
		hs[i] = h
		dir := filepath.Join(e.dir, schema, h.name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		cfg := fmt.Sprintf(`listen: %s:%d
plugins_dir: %s
admin_token: %s
shutdown_timeout_seconds: 5
plugins:
  tasks_worker:
    enabled: true
    config:
      broker: postgres
      dsn: "postgres://postgres@%s:%d/%s?sslmode=disable&connect_timeout=5"
      schema: %s
      data_dir: %s
`+twSettings, l.nsIP, hPort, pluginsDir, adminToken, l.rootIP, pxPort, dbName, schema, dir,
			reclaimAfter, leaseTTL, topicLimit)
		cfgPath := filepath.Join(dir, "taskhost.yaml")
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		h.logPath = filepath.Join(dir, "host.log")
		logf, err := os.Create(h.logPath)
		if err != nil {
			t.Fatal(err)
		}
		h.cmd = exec.Command("ip", "netns", "exec", l.ns, hostBin, "-config", cfgPath)
		h.cmd.Dir = dir
		h.cmd.Stdout, h.cmd.Stderr = logf, logf
		if err := h.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		logf.Close()
		h.exited = make(chan struct{})
		go func() { _ = h.cmd.Wait(); close(h.exited) }()
		t.Cleanup(func() {
			h.stop()
			if t.Failed() {
				t.Logf("%s log (last lines):\n%s", h.name, tail(h.logPath, 60))
			}
		})
	}
	for _, h := range hs {
		waitFor(t, 60*time.Second, h.name+"'s tasks_worker answers /api/health", func() bool {
			var hh health
			return h.get("/health", &hh) == nil && hh.WorkerID != ""
		})
	}
	return hs
}

// stop sends SIGTERM and waits, at most 20 s, then kills what runs in the
// namespace.
func (h *host) stop() {
	select {
	case <-h.exited:
		return
	default:
	}
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.exited:
	case <-time.After(20 * time.Second):
		killNetns(h.l.ns)
		<-h.exited
	}
	killNetns(h.l.ns) // whatever a plugin left behind
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

var client = &http.Client{Timeout: 3 * time.Second}

func (h *host) call(method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	url := path
	if strings.HasPrefix(path, "/") {
		url = h.base + "/plugin-pkg/tasks_worker/api" + path
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %d %s", method, url, resp.StatusCode, bytes.TrimSpace(raw))
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

func (h *host) get(path string, out any) error { return h.call("GET", path, nil, out) }

// root calls a path of the host itself (not the plugin's API).
func (h *host) root(path string, out any) error { return h.call("GET", h.base+path, nil, out) }

type health struct {
	Status   string `json:"status"`
	WorkerID string `json:"worker_id"`
	Error    string `json:"error"`
	Beat     struct {
		Candidate bool  `json:"candidate"`
		Leader    bool  `json:"leader"`
		Term      int64 `json:"term"`
	} `json:"beat"`
}

type pluginStatus struct {
	Name     string `json:"name"`
	State    string `json:"state"`
	PID      int    `json:"pid"`
	Restarts int    `json:"restarts"`
}

// worker is tasks_worker's status in /admin/api/plugins.
func (h *host) worker() (pluginStatus, error) {
	var body struct {
		Plugins []pluginStatus `json:"plugins"`
	}
	if err := h.call("GET", h.base+"/admin/api/plugins", nil, &body); err != nil {
		return pluginStatus{}, err
	}
	for _, p := range body.Plugins {
		if p.Name == "tasks_worker" {
			return p, nil
		}
	}
	return pluginStatus{}, fmt.Errorf("%s: no tasks_worker in /admin/api/plugins", h.name)
}

// submit submits one task; the id of the new message.
func (h *host) submit(task, topic string, payload any) (int64, error) {
	var created struct {
		ID string `json:"id"`
	}
	if err := h.call("POST", "/tasks", map[string]any{"task": task, "topic": topic, "payload": payload}, &created); err != nil {
		return 0, err
	}
	var id int64
	_, err := fmt.Sscan(created.ID, &id)
	return id, err
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start)
}
