package e2e

// TestMain builds the binaries once for the package. The helpers the tests
// share are here (a host run as a process on a config, its plugins'
// states, the checks of its scrape), with the tests of the host as a whole.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/taskhost/taskhost/internal/hostproc"
	"github.com/taskhost/taskhost/internal/testhost"
)

var (
	binDir     string
	pluginsDir string
)

func TestMain(m *testing.M) {
	// Each test's config says where its host listens; a TASKHOST_LISTEN
	// left in the environment would send every host to one address.
	os.Unsetenv("TASKHOST_LISTEN") // host.ListenEnv
	dir, err := os.MkdirTemp("", "taskhost-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	pluginsDir = filepath.Join(dir, "plugins")
	code := 1
	if err := buildBinaries(); err != nil {
		fmt.Fprintln(os.Stderr, "build binaries:", err)
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

func goBuild(out, pkg string) error {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = ".."
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}

func buildBinaries() error {
	if err := os.MkdirAll(pluginsDir, 0o755); err != nil {
		return err
	}
	builds := map[string]string{
		filepath.Join(binDir, "host"):                       "./cmd/host",
		filepath.Join(pluginsDir, "fp-plugin-tasks_worker"): "./plugins/tasksworker/cmd/fp-plugin-tasks_worker",
		filepath.Join(pluginsDir, "fp-plugin-metrics"):      "./plugins/metricsagg/cmd/fp-plugin-metrics",
		filepath.Join(pluginsDir, "fp-plugin-example"):      "./plugins/example/cmd/fp-plugin-example",
		filepath.Join(binDir, "fixture"):                    "./host/testdata/fixture",
		filepath.Join(pluginsDir, "fp-plugin-oldtasks"):     "./capability/internal/testdata/oldprovider",
	}
	for out, pkg := range builds {
		if err := goBuild(out, pkg); err != nil {
			return err
		}
	}
	fixture, err := os.ReadFile(filepath.Join(binDir, "fixture"))
	if err != nil {
		return err
	}
	for _, name := range []string{"echo", "crasher", "impostor", "badconfig", "pinned"} {
		if err := os.WriteFile(filepath.Join(pluginsDir, "fp-plugin-"+name), fixture, 0o755); err != nil {
			return err
		}
	}
	// The hand-made provider answers as a liar under that name.
	old, err := os.ReadFile(filepath.Join(pluginsDir, "fp-plugin-oldtasks"))
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(pluginsDir, "fp-plugin-liar"), old, 0o755)
}

// syncBuffer collects a process's output for assertions.
type syncBuffer = testhost.SyncBuffer

type hostProc struct {
	cmd    *exec.Cmd
	base   string
	log    *syncBuffer
	exited chan struct{}
	err    error
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// startHost writes config (with LISTEN and PLUGINS replaced) and runs the
// host on it until the test ends.
func startHost(t testing.TB, config string) *hostProc {
	t.Helper()
	addr := freeAddr(t)
	config = strings.ReplaceAll(config, "LISTEN", addr)
	config = strings.ReplaceAll(config, "PLUGINS", pluginsDir)
	path := filepath.Join(t.TempDir(), "taskhost.yaml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &hostProc{base: "http://" + addr, log: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(filepath.Join(binDir, "host"), "-config", path)
	p.cmd.Stdout = p.log
	p.cmd.Stderr = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("host log:\n%s", p.log.String())
		}
	})
	waitFor(t, 60*time.Second, "host answers /healthz", func() bool {
		resp, err := http.Get(p.base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return p
}

// stop stops the host with SIGTERM (SIGKILL after 30 s) and waits for it;
// stopping a stopped host does nothing.
func (p *hostProc) stop() { hostproc.Terminate(p.cmd, p.exited, syscall.SIGTERM, 30*time.Second) }

// waitFor polls cond until it holds, failing the test after timeout.
var waitFor = testhost.WaitFor

type pluginStatus struct {
	Name         string   `json:"name"`
	State        string   `json:"state"`
	PID          int      `json:"pid"`
	Restarts     int      `json:"restarts"`
	LastError    string   `json:"last_error"`
	Capabilities []string `json:"capabilities"`
}

func (p *hostProc) plugins(t *testing.T) map[string]pluginStatus {
	t.Helper()
	resp, err := http.Get(p.base + "/admin/api/plugins")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Plugins []pluginStatus `json:"plugins"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	out := map[string]pluginStatus{}
	for _, s := range body.Plugins {
		out[s.Name] = s
	}
	return out
}

func (p *hostProc) waitState(t *testing.T, name, state string, timeout time.Duration) pluginStatus {
	t.Helper()
	var st pluginStatus
	waitFor(t, timeout, name+" is "+state, func() bool {
		st = p.plugins(t)[name]
		return st.State == state
	})
	return st
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// sigterm sends the host SIGTERM and waits for it to exit.
func (h *hostProc) sigterm(t *testing.T) {
	t.Helper()
	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("host did not exit within 60s of SIGTERM")
	}
}

func pidAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	if err != nil {
		return false
	}
	// A zombie still answers signal 0; look at its state.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(b))
	return len(fields) > 2 && fields[2] != "Z"
}

const fullConfig = `
listen: LISTEN
plugins_dir: PLUGINS
restart_budget: 2
health_interval_seconds: 1
hung_restart_seconds: 5
plugins:
  tasks_worker:
    enabled: true
    config:
      broker: memory
      workers: 4
      demo_tasks: true
  metrics:
    enabled: true
  echo:
    enabled: true
  crasher:
    enabled: true
  impostor:
    enabled: true
  badconfig:
    enabled: true
  pinned:
    enabled: true
    sha256: 0000000000000000000000000000000000000000000000000000000000000000
  missing:
    enabled: true
  resting:
    enabled: false
`

// brokerGauges are the tasks_worker series spec 002 requires, as scraped.
var brokerGauges = []string{
	"fp_tasks_worker_fastpluggy_broker_topics",
	"fp_tasks_worker_fastpluggy_broker_workers",
	"fp_tasks_worker_fastpluggy_broker_locks",
	"fp_tasks_worker_fastpluggy_broker_topic_queued",
	"fp_tasks_worker_fastpluggy_broker_topic_running",
	"fp_tasks_worker_fastpluggy_broker_topic_dead_letter",
	"fp_tasks_worker_fastpluggy_broker_topic_subscribers",
	"fp_tasks_worker_fastpluggy_broker_topic_paused",
	"fp_tasks_worker_fastpluggy_broker_messages_queued_total",
	"fp_tasks_worker_fastpluggy_broker_messages_running_total",
	"fp_tasks_worker_fastpluggy_broker_beats",
	"fp_tasks_worker_fastpluggy_tasks_submitted_total",
	"fp_tasks_worker_fastpluggy_tasks_completed_total",
	"fp_tasks_worker_fastpluggy_tasks_failed_total",
	"fp_tasks_worker_fastpluggy_tasks_running",
}

func hasSeries(body, name string) bool {
	return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `[{ ]`).MatchString(body)
}

func TestHostEndToEnd(t *testing.T) {
	h := startHost(t, fullConfig)
	tw := h.waitState(t, "tasks_worker", "running", 30*time.Second)
	h.waitState(t, "metrics", "running", 30*time.Second)
	h.waitState(t, "echo", "running", 30*time.Second)

	t.Run("broken plugins are reported and the others keep running", func(t *testing.T) {
		if st := h.waitState(t, "crasher", "failed", 30*time.Second); !strings.Contains(st.LastError, "did not answer with the plugin handshake") ||
			!strings.Contains(st.LastError, "(exit status 3)") || !strings.Contains(st.LastError, "crasher: failing on purpose at start") {
			t.Errorf("crasher: last error %q; want the missing handshake, the exit status and its stderr", st.LastError)
		}
		cases := map[string]string{
			"crasher":   "gave up after 2 restarts",
			"impostor":  `says its name is "somebody_else", but it is configured as "impostor"`,
			"badconfig": "plugins.badconfig.config: color: must be red or blue",
			"pinned":    "does not match its sha256 pin",
			"missing":   "no binary",
		}
		for name, want := range cases {
			st := h.waitState(t, name, "failed", 30*time.Second)
			if !strings.Contains(st.LastError, want) {
				t.Errorf("%s: last error %q, want it to contain %q", name, st.LastError, want)
			}
			escaped := strings.ReplaceAll(want, `"`, `\"`)
			waitFor(t, 60*time.Second, name+"'s error is in the host log", func() bool {
				return strings.Contains(h.log.String(), want) || strings.Contains(h.log.String(), escaped)
			})
		}
		if st := h.plugins(t)["resting"]; st.State != "disabled" {
			t.Errorf("resting: state %q, want disabled", st.State)
		}
		code, body := get(t, h.base+"/healthz")
		var health struct {
			Status  string            `json:"status"`
			Plugins map[string]string `json:"plugins"`
		}
		if err := json.Unmarshal([]byte(body), &health); err != nil || code != http.StatusOK || health.Status != "degraded" ||
			health.Plugins["crasher"] != "failed" || health.Plugins["tasks_worker"] != "running" {
			t.Errorf("/healthz with failed plugins: %d %s; want 200, degraded, each plugin's state", code, body)
		}
		_, page := get(t, h.base+"/admin/")
		for name, want := range cases {
			if !strings.Contains(page, `id="plugin-`+name+`"`) {
				t.Errorf("/admin does not list %s", name)
			}
			if !strings.Contains(page, template_escape(want)) {
				t.Errorf("/admin does not show %s's error %q", name, want)
			}
		}
		for _, name := range []string{"tasks_worker", "metrics", "echo"} {
			if st := h.plugins(t)[name]; st.State != "running" {
				t.Errorf("%s is %s, want running beside the broken ones", name, st.State)
			}
		}
		if code, body := get(t, h.base+"/plugin-pkg/crasher/x"); code != http.StatusServiceUnavailable || !strings.Contains(body, "stays down until an operator presses Restart") {
			t.Errorf("proxy to a failed plugin: %d %s, want 503 saying it stays down until restarted", code, body)
		}
	})

	t.Run("a task submitted through the proxy runs", func(t *testing.T) {
		resp, err := http.Post(h.base+"/plugin-pkg/tasks_worker/api/tasks", "application/json",
			strings.NewReader(`{"task": "demo.echo", "topic": "default", "payload": {"hello": "world"}}`))
		if err != nil {
			t.Fatal(err)
		}
		var created struct {
			ID string `json:"id"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&created)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || created.ID == "" {
			t.Fatalf("submit: %d %+v", resp.StatusCode, created)
		}
		var task struct {
			State  string          `json:"state"`
			Result json.RawMessage `json:"result"`
		}
		waitFor(t, 60*time.Second, "the task is done", func() bool {
			_, body := get(t, h.base+"/plugin-pkg/tasks_worker/api/tasks/"+created.ID)
			_ = json.Unmarshal([]byte(body), &task)
			return task.State == "done"
		})
		if string(task.Result) != `{"hello":"world"}` {
			t.Errorf("result = %s", task.Result)
		}
	})

	t.Run("scrape shows every broker gauge and passes promtool", func(t *testing.T) {
		code, body := get(t, h.base+"/plugin-pkg/metrics/api/prometheus")
		if code != 200 {
			t.Fatalf("scrape: %d %s", code, body)
		}
		for _, name := range brokerGauges {
			if !hasSeries(body, name) {
				t.Errorf("scrape lacks %s", name)
			}
		}
		if !strings.Contains(body, `fp_metrics_source_up{plugin="tasks_worker"} 1`) || !strings.Contains(body, `fp_echo_fixture_up 1`) {
			t.Errorf("scrape lacks source_up 1 for tasks_worker or the echo plugin's series")
		}
		promtoolCheck(t, body)
	})

	t.Run("proxy filters headers, limits bodies and streams", func(t *testing.T) {
		req, _ := http.NewRequest("GET", h.base+"/plugin-pkg/echo/headers", nil)
		req.Header.Set("Cookie", "session=secret")
		req.Header.Set("X-Forwarded-For", "6.6.6.6")
		req.Header.Set("X-Custom", "kept")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var seen map[string][]string
		_ = json.NewDecoder(resp.Body).Decode(&seen)
		resp.Body.Close()
		if resp.Header.Get("Set-Cookie") != "" {
			t.Errorf("a plugin set a cookie on the host: %q", resp.Header.Get("Set-Cookie"))
		}
		if _, ok := seen["Cookie"]; ok {
			t.Errorf("the host's cookies reached the plugin: %v", seen)
		}
		if seen["X-Custom"][0] != "kept" || seen["X-Forwarded-For"][0] != "127.0.0.1" {
			t.Errorf("forwarded headers = %v", seen)
		}
		code, body := get(t, h.base+"/plugin-pkg/echo/echo?a=b")
		if code != 200 || body != "GET /echo?a=b 0" {
			t.Errorf("echo: %d %q", code, body)
		}
		if code, body := get(t, h.base+"/plugin-pkg/echo/echo%00x"); code != http.StatusBadRequest || !strings.Contains(body, "control character") {
			t.Errorf("a path with %%00: %d %s; want 400 naming the control character", code, body)
		}
		resp, err = http.Post(h.base+"/plugin-pkg/echo/echo", "text/plain", bytes.NewReader(make([]byte, 9<<20)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("9 MiB body: %d, want 413", resp.StatusCode)
		}
		code, _ = get(t, h.base+"/plugin-pkg/nobody/x")
		if code != 404 {
			t.Errorf("unknown plugin: %d, want 404", code)
		}
		code, _ = get(t, h.base+"/plugin-pkg/resting/x")
		if code != 404 {
			t.Errorf("disabled plugin: %d, want 404", code)
		}
		resp, err = http.Get(h.base + "/plugin-pkg/echo/stream")
		if err != nil {
			t.Fatal(err)
		}
		first := make([]byte, 9)
		start := time.Now()
		if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "data: 0\n"+"\n" {
			t.Errorf("stream first event %q, %v", first, err)
		}
		if time.Since(start) > 300*time.Millisecond {
			// The plugin sleeps 200ms between events: the first one must
			// arrive before the whole response is done.
			t.Logf("first streamed event took %s", time.Since(start))
		}
		rest, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(rest) != "data: 1\n\ndata: 2\n\n" {
			t.Errorf("stream rest %q", rest)
		}
	})

	t.Run("proxy keeps the path's escaping and refuses what a plugin cannot be given", func(t *testing.T) {
		// The plugin decodes the path once, as a server would.
		for path, want := range map[string]string{
			"/path/x%2541":    "/path/x%41 /path/x%2541",
			"/path/50%25off":  "/path/50%off /path/50%25off",
			"/path/a%2Fb":     "/path/a/b /path/a%2Fb",
			"/path/caf%C3%A9": "/path/café /path/caf%C3%A9",
		} {
			if code, body := get(t, h.base+"/plugin-pkg/echo"+path); code != 200 || body != want {
				t.Errorf("GET %s: %d %q, want 200 %q", path, code, body, want)
			}
		}
		req, _ := http.NewRequest("GET", h.base+"/plugin-pkg/echo/echo", nil)
		req.Header.Set("X-Name", "caf\xe9")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "X-Name holds bytes that are not UTF-8") {
			t.Errorf("a header that is not UTF-8: %d %s; want 400 naming it", resp.StatusCode, body)
		}
		// A raw query byte that is not UTF-8, which Go's server lets through.
		conn, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET /plugin-pkg/echo/echo?x=caf\xe9 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
		raw, _ := io.ReadAll(conn)
		conn.Close()
		if !strings.HasPrefix(string(raw), "HTTP/1.1 400") || !strings.Contains(string(raw), "query string holds bytes that are not UTF-8") {
			t.Errorf("a query that is not UTF-8: %q, want a 400 saying so", raw)
		}
		// DNS rebinding: a page on another name that resolves to 127.0.0.1.
		_, port, _ := net.SplitHostPort(strings.TrimPrefix(h.base, "http://"))
		for host, want := range map[string]int{"evil.example:" + port: http.StatusMisdirectedRequest, "localhost:" + port: 200, "127.0.0.1:" + port: 200} {
			req, _ := http.NewRequest("GET", h.base+"/healthz", nil)
			req.Host = host
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != want || (want != 200 && !strings.Contains(string(body), "DNS rebinding")) {
				t.Errorf("GET /healthz with Host %s: %d %s, want %d", host, resp.StatusCode, body, want)
			}
		}
	})

	t.Run("the reclaim button invokes the action and shows its answer", func(t *testing.T) {
		jar, _ := cookiejar.New(nil)
		client := &http.Client{Jar: jar}
		resp, err := client.Get(h.base + "/admin/")
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		m := regexp.MustCompile(`name="csrf_token" value="([0-9a-f]+)"`).FindSubmatch(page)
		if m == nil {
			t.Fatal("no CSRF token in /admin")
		}
		if !strings.Contains(string(page), `action="/admin/plugins/tasks_worker/actions/reclaim_orphaned_messages"`) {
			t.Fatal("/admin has no reclaim button for tasks_worker")
		}
		// Without the token the POST is refused and nothing runs.
		resp, err = client.PostForm(h.base+"/admin/plugins/tasks_worker/actions/reclaim_orphaned_messages", url.Values{})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("POST without CSRF token: %d, want 403", resp.StatusCode)
		}
		resp, err = client.PostForm(h.base+"/admin/plugins/tasks_worker/actions/reclaim_orphaned_messages", url.Values{"csrf_token": {string(m[1])}})
		if err != nil {
			t.Fatal(err)
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(answer), "memory broker cannot orphan") || !strings.Contains(string(answer), `id="flash"`) {
			t.Errorf("reclaim: %d, page does not show the answer:\n%s", resp.StatusCode, answer)
		}
		audit := regexp.MustCompile(`audit: admin action.*plugin=tasks_worker.*action=reclaim_orphaned_messages.*outcome=ok`)
		waitFor(t, 60*time.Second, "the audit line for the reclaim action is in the host log", func() bool {
			return audit.MatchString(h.log.String())
		})
	})

	t.Run("a SIGKILLed plugin is restarted and the scrape survives meanwhile", func(t *testing.T) {
		before := h.plugins(t)["tasks_worker"]
		if before.PID == 0 || before.PID != tw.PID {
			t.Fatalf("tasks_worker pid %d (was %d)", before.PID, tw.PID)
		}
		if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		sawDown := false
		waitFor(t, 30*time.Second, "the scrape reports tasks_worker down", func() bool {
			code, body := get(t, h.base+"/plugin-pkg/metrics/api/prometheus")
			if code != 200 {
				t.Fatalf("scrape failed while tasks_worker was down: %d", code)
			}
			if strings.Contains(body, `fp_metrics_source_up{plugin="tasks_worker"} 0`) {
				sawDown = true
				if hasSeries(body, "fp_tasks_worker_fastpluggy_broker_beats") {
					t.Error("series of a dead plugin were served")
				}
			}
			return sawDown
		})
		// The scrape can see the death before the supervisor does: wait
		// for a new process, not only for the state.
		after, _ := h.waitWorker(t, before.PID)
		if after.Restarts < 1 {
			t.Errorf("after restart: pid %d (was %d), restarts %d", after.PID, before.PID, after.Restarts)
		}
		waitFor(t, 60*time.Second, "tasks_worker series are back", func() bool {
			_, body := get(t, h.base+"/plugin-pkg/metrics/api/prometheus")
			return hasSeries(body, "fp_tasks_worker_fastpluggy_broker_beats") && strings.Contains(body, `fp_metrics_source_up{plugin="tasks_worker"} 1`)
		})
		if !strings.Contains(h.log.String(), "plugin process exited unexpectedly (signal: killed)") {
			t.Error("the host did not log the crash with its cause")
		}
	})

	t.Run("a frozen plugin fails its health checks and is restarted", func(t *testing.T) {
		before := h.plugins(t)["echo"]
		if before.State != "running" || before.PID == 0 {
			t.Fatalf("echo: %+v, want running", before)
		}
		// SIGSTOP: the process lives and its connection stays open, but
		// nothing answers.
		if err := syscall.Kill(before.PID, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(before.PID, syscall.SIGCONT) })
		waitFor(t, 60*time.Second, "the frozen echo plugin is replaced by a new process", func() bool {
			st := h.plugins(t)["echo"]
			return st.State == "running" && st.PID != 0 && st.PID != before.PID
		})
		if after := h.plugins(t)["echo"]; after.Restarts <= before.Restarts || !strings.Contains(after.LastError, "health checks failed") {
			t.Errorf("echo after the freeze: restarts %d (was %d), last error %q; want a restart for failed health checks",
				after.Restarts, before.Restarts, after.LastError)
		}
		waitFor(t, 60*time.Second, "the frozen process is gone", func() bool { return !pidAlive(before.PID) })
	})

	t.Run("SIGTERM stops every plugin and the host exits cleanly", func(t *testing.T) {
		pids := []int{}
		for _, st := range h.plugins(t) {
			if st.PID > 0 {
				pids = append(pids, st.PID)
			}
		}
		h.sigterm(t)
		if h.err != nil {
			t.Errorf("host exit: %v", h.err)
		}
		for _, pid := range pids {
			if pidAlive(pid) {
				t.Errorf("plugin pid %d still alive after the host stopped", pid)
			}
		}
	})
}

// template_escape mirrors html/template's escaping of quotes in text.
func template_escape(s string) string {
	return strings.NewReplacer(`"`, "&#34;", "'", "&#39;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// specTotalGauges are gauges whose names spec 002 fixes with a _total
// suffix; promtool's warning about them is expected.
var specTotalGauges = map[string]bool{
	"fp_tasks_worker_fastpluggy_broker_messages_queued_total":  true,
	"fp_tasks_worker_fastpluggy_broker_messages_running_total": true,
}

func promtoolCheck(t *testing.T, body string) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install Debian's prometheus package (apt-get install -y prometheus); make test does this: scripts/test-setup.sh")
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	out, _ := cmd.CombinedOutput()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		name := strings.Fields(line)[0]
		if specTotalGauges[name] && strings.Contains(line, `non-counter metrics should not have "_total" suffix`) {
			continue
		}
		t.Errorf("promtool check metrics: %s", line)
	}
}

func TestHostKilledPluginsExit(t *testing.T) {
	h := startHost(t, `
listen: LISTEN
plugins_dir: PLUGINS
plugins:
  echo:
    enabled: true
  metrics:
    enabled: true
`)
	echo := h.waitState(t, "echo", "running", 30*time.Second)
	metrics := h.waitState(t, "metrics", "running", 30*time.Second)
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-h.exited
	waitFor(t, 60*time.Second, "plugins exit after their host was SIGKILLed", func() bool {
		return !pidAlive(echo.PID) && !pidAlive(metrics.PID)
	})
}

func TestBadConfigExitsWithTheKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte("listen: 0.0.0.0:8080\nplugins:\n  metrics:\n    enabled: maybe\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(binDir, "host"), "-config", path).CombinedOutput()
	if err == nil {
		t.Fatalf("host accepted a bad config:\n%s", out)
	}
	if !strings.Contains(string(out), "plugins.metrics.enabled: expected true or false") {
		t.Fatalf("error does not name the key:\n%s", out)
	}
	out, err = exec.Command(filepath.Join(binDir, "host"), "-config", filepath.Join(t.TempDir(), "nope.yaml")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no such file") {
		t.Fatalf("missing config: %v\n%s", err, out)
	}
}

func TestAdminTokenOnNonLoopback(t *testing.T) {
	// Listening on every interface needs the token for /admin, for
	// mutating requests and, by default, for reads of plugin HTTP.
	port := strings.Split(freeAddr(t), ":")[1]
	cfg := strings.ReplaceAll(`
listen: 0.0.0.0:PORT
plugins_dir: PLUGINS
admin_token: test-token-0123456789
plugins:
  echo:
    enabled: true
`, "PORT", port)
	cfg = strings.ReplaceAll(cfg, "PLUGINS", pluginsDir)
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &hostProc{base: "http://127.0.0.1:" + port, log: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(filepath.Join(binDir, "host"), "-config", path)
	p.cmd.Stderr = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() { _ = p.cmd.Process.Kill(); <-p.exited })
	waitFor(t, 60*time.Second, "host answers", func() bool {
		resp, err := http.Get(p.base + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(p.base + "/admin/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || !strings.HasPrefix(resp.Header.Get("Location"), "/admin/login") {
		t.Errorf("/admin without token: %d %s, want a redirect to the login", resp.StatusCode, resp.Header.Get("Location"))
	}
	// An API client gets a 401, not the login page.
	resp, err = noRedirect.Get(p.base + "/admin/api/plugins")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("/admin/api/plugins without the token: %d, want 401", resp.StatusCode)
	}
	// The scheme's case does not matter.
	for _, scheme := range []string{"Bearer", "bearer"} {
		req, _ := http.NewRequest("GET", p.base+"/admin/api/plugins", nil)
		req.Header.Set("Authorization", scheme+" test-token-0123456789")
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("/admin/api/plugins with the token (%s): %d", scheme, resp.StatusCode)
		}
	}
	waitFor(t, 60*time.Second, "echo runs", func() bool {
		req, _ := http.NewRequest("GET", p.base+"/plugin-pkg/echo/echo", nil)
		req.Header.Set("Authorization", "Bearer test-token-0123456789")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	// Off loopback, reads of plugin HTTP need the token too
	// (public_reads defaults to false there).
	resp, err = http.Get(p.base + "/plugin-pkg/echo/echo")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET of a plugin without the token off loopback: %d, want 401", resp.StatusCode)
	}
	resp, err = http.Post(p.base+"/plugin-pkg/echo/echo", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST to a plugin without the token: %d, want 401", resp.StatusCode)
	}
	// A login with the wrong token is refused; the right one opens /admin.
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	resp, err = c.PostForm(p.base+"/admin/login", url.Values{"token": {"wrong"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("login with a wrong token: %d", resp.StatusCode)
	}
	resp, err = c.PostForm(p.base+"/admin/login", url.Values{"token": {"test-token-0123456789"}, "next": {"/admin/"}})
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), `id="plugin-echo"`) {
		t.Errorf("after login: %d, page lacks the plugin list", resp.StatusCode)
	}
}

// TestPluginChildrenDieWithIt: a plugin binary that starts a child process
// and then fails its handshake. The host kills the plugin's whole process
// group, so the child does not live on, reparented to init.
func TestPluginChildrenDieWithIt(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	script := "#!/bin/sh\nsleep 300 &\necho $! > " + pidFile + ".tmp\nmv " + pidFile + ".tmp " + pidFile + "\necho 'not a handshake'\nsleep 300\n"
	if err := os.WriteFile(filepath.Join(dir, "fp-plugin-spawner"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	startHost(t, "listen: LISTEN\nplugins_dir: "+dir+"\nplugins:\n  spawner:\n    enabled: true\n")
	var child int
	waitFor(t, 60*time.Second, "the plugin started its child", func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		child, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && child > 0
	})
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	waitFor(t, 60*time.Second, "the child of the failed plugin is gone", func() bool { return !pidAlive(child) })
}
