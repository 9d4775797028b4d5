// Package python_test runs the Python SDK's plugins under the real host:
// the example plugin and the test plugins in testdata are packed with
// mkplugin.py into a plugins directory beside tasks_worker, and driven
// through the tasks API. It also runs the SDK's Python unit tests.
//
// It needs Debian's /usr/bin/python3 with python3-grpcio, python3-protobuf
// and python3-cryptography (scripts/test-setup.sh installs them).
package python_test

import (
	"bytes"
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

	"github.com/taskhost/taskhost/internal/testhost"
)

// python is the interpreter the SDK is written for; the PATH's python3
// may be another one without Debian's packages.
const python = "/usr/bin/python3"

// checkPython fails the test, saying how to fix it, when the interpreter
// or one of the SDK's packages is missing.
func checkPython(t *testing.T) {
	t.Helper()
	out, err := exec.Command(python, "-c", "import grpc, google.protobuf, cryptography").CombinedOutput()
	if err != nil {
		t.Fatalf("%s cannot import the SDK's packages (%v: %s): run scripts/test-setup.sh as root, or apt-get install -y python3 python3-grpcio python3-protobuf python3-cryptography", python, err, bytes.TrimSpace(out))
	}
}

// TestPythonUnitTests runs the SDK's unittest suite (make test/python).
func TestPythonUnitTests(t *testing.T) {
	checkPython(t)
	cmd := exec.Command(python, "-m", "unittest", "discover", "-s", "tests", "-t", ".")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python unit tests failed: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// pack builds a Python plugin into plugins/fp-plugin-<name>.
func pack(t *testing.T, plugins, source, name string) {
	t.Helper()
	out, err := exec.Command(python, "mkplugin.py", source, "-o", filepath.Join(plugins, "fp-plugin-"+name)).CombinedOutput()
	if err != nil {
		t.Fatalf("mkplugin %s: %v\n%s", source, err, out)
	}
}

type host struct {
	url string
	log *testhost.SyncBuffer
}

func (h *host) api(path string) string { return h.url + "/plugin-pkg/tasks_worker/api" + path }

func (h *host) get(t *testing.T, url string, into any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, into); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, body)
	}
}

// submit submits a task, retrying while tasks_worker has not registered
// it yet (a provider's tasks come within a refresh), and returns its id.
func (h *host) submit(t *testing.T, task string, payload any, maxAttempts int) string {
	t.Helper()
	req := map[string]any{"task": task, "payload": payload}
	if maxAttempts > 0 {
		req["max_attempts"] = maxAttempts
	}
	body, _ := json.Marshal(req)
	var id, last string
	waitFor(t, 60*time.Second, task+" is accepted", func() bool {
		resp, err := http.Post(h.api("/tasks"), "application/json", bytes.NewReader(body))
		if err != nil {
			last = err.Error()
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var out struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(b, &out)
		id, last = out.ID, fmt.Sprintf("%d %s", resp.StatusCode, b)
		return resp.StatusCode == http.StatusCreated
	}, func() string { return last })
	return id
}

type task struct {
	State    string          `json:"state"`
	Attempts int             `json:"attempts"`
	Result   json.RawMessage `json:"result"`
	Error    *string         `json:"error"`
}

type report struct {
	Attempt  int             `json:"attempt"`
	Status   string          `json:"status"`
	Error    string          `json:"error"`
	Logs     []string        `json:"logs"`
	Progress float64         `json:"progress"`
	Result   json.RawMessage `json:"result"`
}

// wait returns the task once it is in a final state.
func (h *host) wait(t *testing.T, id string, timeout time.Duration) task {
	t.Helper()
	var v task
	waitFor(t, timeout, "task "+id+" ends", func() bool {
		h.get(t, h.api("/tasks/"+id), &v)
		return v.State == "done" || v.State == "failed" || v.State == "dead" || v.State == "cancelled"
	}, func() string { return "state " + v.State })
	return v
}

func (h *host) reports(t *testing.T, id string) []report {
	t.Helper()
	var r struct {
		Reports []report `json:"reports"`
	}
	h.get(t, h.api("/reports?message_id="+id), &r)
	return r.Reports
}

type plugin struct {
	State     string `json:"state"`
	PID       int    `json:"pid"`
	LastError string `json:"last_error"`
}

func (h *host) plugin(t *testing.T, name string) plugin {
	t.Helper()
	var r struct {
		Plugins []struct {
			Name string `json:"name"`
			plugin
		} `json:"plugins"`
	}
	h.get(t, h.url+"/admin/api/plugins", &r)
	for _, p := range r.Plugins {
		if p.Name == name {
			return p.plugin
		}
	}
	t.Fatalf("no plugin %s in /admin/api/plugins", name)
	return plugin{}
}

func (h *host) waitState(t *testing.T, name, state string) plugin {
	t.Helper()
	var p plugin
	waitFor(t, 60*time.Second, name+" is "+state, func() bool {
		p = h.plugin(t, name)
		return p.State == state
	}, func() string { return fmt.Sprintf("%+v", p) })
	return p
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool, last func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s (last: %s)", timeout, what, last())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func pidAlive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

// TestPythonPluginsUnderTheHost: the Python plugins' tasks run through the
// tasks API with their logs, progress, results and retries; a Python
// plugin killed mid-task fails that attempt naming it and a retry
// finishes the task; broken Python plugins are reported as clearly as Go
// ones (a wrong name, a crash or a print at start, a start that hangs, a
// task past its timeout, a result that is not JSON); SIGTERM of the host
// makes the Python plugins exit by themselves.
func TestPythonPluginsUnderTheHost(t *testing.T) {
	checkPython(t)
	dir := t.TempDir()
	plugins := filepath.Join(dir, "plugins")
	if err := testhost.Build(dir); err != nil {
		t.Fatal(err)
	}
	pack(t, plugins, "../../examples/python/pyexample", "pyexample")
	pack(t, plugins, "testdata/pytasks.py", "pytasks")
	pack(t, plugins, "testdata/impostor.py", "pyimpostor")
	pack(t, plugins, "testdata/crasher.py", "pycrasher")
	pack(t, plugins, "testdata/stdout.py", "pystdout")
	pack(t, plugins, "testdata/hang.py", "pyhang")

	log := &testhost.SyncBuffer{}
	url, stop, err := testhost.Start(dir, `restart_budget: 1
shutdown_timeout_seconds: 20
plugins:
  tasks_worker:
    enabled: true
    config: {broker: memory, workers: 4}
  pyexample: {enabled: true}
  pytasks: {enabled: true}
  pyimpostor: {enabled: true}
  pycrasher: {enabled: true}
  pystdout: {enabled: true}
  pyhang: {enabled: true}
`, log)
	if err != nil {
		t.Fatalf("start the host: %v\n%s", err, log.String())
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
		if t.Failed() {
			t.Logf("host log:\n%s", log.String())
		}
	})
	h := &host{url: url, log: log}
	ex := h.waitState(t, "pyexample", "running")
	h.waitState(t, "pytasks", "running")

	t.Run("a task logs, reports progress and returns its result", func(t *testing.T) {
		id := h.submit(t, "pyexample.greet", map[string]any{"name": "Ada"}, 0)
		v := h.wait(t, id, 60*time.Second)
		if v.State != "done" || string(v.Result) != `{"greeting":"hello, Ada","attempt":1}` {
			t.Fatalf("pyexample.greet: state %s, result %s", v.State, v.Result)
		}
		reps := h.reports(t, id)
		if len(reps) != 1 || reps[0].Progress != 1 || strings.Join(reps[0].Logs, "|") != "step 1 of 2: hello,|step 2 of 2: Ada" {
			t.Fatalf("pyexample.greet's report: %+v; want one success with progress 1 and two log lines", reps)
		}
	})

	t.Run("a task uses the host's services", func(t *testing.T) {
		id := h.submit(t, "pytasks.relay", map[string]any{}, 1)
		v := h.wait(t, id, 60*time.Second)
		want := `{"plugins":["pyexample","pytasks"],"tasks":["pyexample.fanout","pyexample.flaky","pyexample.greet"],"greeting":"hello, relay","logs":["step 1 of 2: hello,","step 2 of 2: relay"]}`
		if v.State != "done" || string(v.Result) != want {
			t.Fatalf("pytasks.relay: state %s, result %s, error %v; want done with %s", v.State, v.Result, v.Error, want)
		}
	})

	t.Run("a task submits its children", func(t *testing.T) {
		id := h.submit(t, "pyexample.fanout", map[string]any{"names": []string{"Ada", "Alan"}}, 0)
		v := h.wait(t, id, 60*time.Second)
		var res struct {
			Children []string `json:"children"`
		}
		if v.State != "done" || json.Unmarshal(v.Result, &res) != nil || len(res.Children) != 2 {
			t.Fatalf("pyexample.fanout: state %s, result %s", v.State, v.Result)
		}
		for i, cid := range res.Children {
			var c struct {
				task
				ParentTaskID string `json:"parent_task_id"`
			}
			waitFor(t, 60*time.Second, "child "+cid+" ends", func() bool {
				h.get(t, h.api("/tasks/"+cid), &c)
				return c.State == "done"
			}, func() string { return c.State })
			want := fmt.Sprintf(`{"greeting":"hello, %s","attempt":1}`, []string{"Ada", "Alan"}[i])
			if c.ParentTaskID != id || string(c.Result) != want {
				t.Fatalf("child %s: parent %q, result %s; want %s and %s", cid, c.ParentTaskID, c.Result, id, want)
			}
		}
	})

	t.Run("a failed attempt is retried", func(t *testing.T) {
		id := h.submit(t, "pyexample.flaky", map[string]any{"fail": 2}, 0)
		v := h.wait(t, id, 60*time.Second)
		if v.State != "done" || v.Attempts != 3 || string(v.Result) != `{"succeeded_at_attempt":3}` {
			t.Fatalf("pyexample.flaky: state %s, attempts %d, result %s", v.State, v.Attempts, v.Result)
		}
		var failed int
		for _, r := range h.reports(t, id) {
			if r.Status == "failed" && strings.Contains(r.Error, "failed on purpose") {
				failed++
			}
		}
		if failed != 2 {
			t.Fatalf("pyexample.flaky: %d failed attempts in its reports, want 2: %+v", failed, h.reports(t, id))
		}
	})

	t.Run("errors are reported clearly", func(t *testing.T) {
		// One attempt each (a provider's tasks get at least 3 unless the
		// submit says otherwise); the default topic keeps dead letters.
		cases := []struct{ task, want string }{
			// The host bounds the attempt (TaskSpec.timeout_seconds); the
			// handler ignores it, and its process (hard_stop) is killed.
			{"pytasks.hang", "timed out after 1s: task pytasks.hang was killed"},
			{"pytasks.notjson", "task pytasks.notjson returned a result that is not JSON: Object of type set is not JSON serializable"},
			{"pytasks.rawbad", "the task's result cannot be stored: it is not valid JSON"},
			{"pytasks.raise", "KeyError: 'missing'"},
		}
		ids := make([]string, len(cases))
		for i, c := range cases {
			ids[i] = h.submit(t, c.task, map[string]any{}, 1)
		}
		for i, c := range cases {
			v := h.wait(t, ids[i], 60*time.Second)
			if v.State != "dead" || v.Error == nil || !strings.Contains(*v.Error, c.want) {
				got := "<nil>"
				if v.Error != nil {
					got = *v.Error
				}
				t.Errorf("%s: state %s, error %q; want dead with %q", c.task, v.State, got, c.want)
			}
		}
	})

	t.Run("a print to stdout is logged as a warning, the task runs", func(t *testing.T) {
		id := h.submit(t, "pytasks.print", map[string]any{}, 0)
		if v := h.wait(t, id, 60*time.Second); v.State != "done" {
			t.Fatalf("pytasks.print: state %s", v.State)
		}
		waitFor(t, 30*time.Second, "the host log warns of the print", func() bool {
			return strings.Contains(log.String(), "plugin wrote to stdout directly; use the logger") &&
				strings.Contains(log.String(), "a stray line from pytasks.print")
		}, func() string { return "" })
	})

	t.Run("a line written to stderr directly is logged, whatever it holds", func(t *testing.T) {
		// Sent as it is, this JSON line (its "@message" is not a string)
		// would make an older host's log reader, go-plugin's, panic.
		id := h.submit(t, "pytasks.stderr", map[string]any{}, 0)
		if v := h.wait(t, id, 60*time.Second); v.State != "done" {
			t.Fatalf("pytasks.stderr: state %s", v.State)
		}
		waitFor(t, 30*time.Second, "the host log has the line", func() bool {
			return strings.Contains(log.String(), `{"@message": 1, "@level": 2, "@timestamp": 3}`)
		}, func() string { return "" })
		if p := h.plugin(t, "pytasks"); p.State != "running" {
			t.Fatalf("pytasks after its stderr line: %+v", p)
		}
	})

	t.Run("broken Python plugins are reported", func(t *testing.T) {
		cases := map[string][]string{
			"pyimpostor": {`says its name is "somebody_else", but it is configured as "pyimpostor"`},
			"pycrasher":  {"did not answer with the plugin handshake", "(exit status 1)", "RuntimeError: pycrasher: failing on purpose at start"},
			"pystdout":   {"did not answer with the plugin handshake"},
			// go-plugin waits 20 s for the handshake.
			"pyhang": {"timeout while waiting for plugin to start"},
		}
		for name, wants := range cases {
			var p plugin
			waitFor(t, 90*time.Second, name+" is reported", func() bool {
				p = h.plugin(t, name)
				for _, w := range wants {
					if !strings.Contains(p.LastError, w) {
						return false
					}
				}
				return true
			}, func() string { return fmt.Sprintf("%+v", p) })
		}
		if h.plugin(t, "pyexample").State != "running" {
			t.Error("pyexample stopped running beside the broken plugins")
		}
	})

	t.Run("a Python plugin killed mid-task: the attempt fails naming it, a retry finishes", func(t *testing.T) {
		before := h.plugin(t, "pytasks")
		id := h.submit(t, "pytasks.count", map[string]any{"to": 30, "step_ms": 100}, 0)
		var v task
		waitFor(t, 60*time.Second, "pytasks.count runs", func() bool {
			h.get(t, h.api("/tasks/"+id), &v)
			return v.State == "running"
		}, func() string { return v.State })
		if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		v = h.wait(t, id, 120*time.Second)
		if v.State != "done" || v.Attempts < 2 || string(v.Result) != `{"counted":30}` {
			t.Fatalf("pytasks.count after its plugin was killed: state %s, attempts %d, result %s", v.State, v.Attempts, v.Result)
		}
		var failed, success bool
		for _, r := range h.reports(t, id) {
			failed = failed || (r.Status == "failed" && strings.Contains(r.Error, "pytasks"))
			success = success || (r.Status == "success" && len(r.Logs) > 0 && r.Progress == 1)
		}
		if !failed || !success {
			t.Fatalf("reports of pytasks.count: %+v; want a failed attempt naming pytasks and a successful one with logs and progress", h.reports(t, id))
		}
		if after := h.plugin(t, "pytasks"); after.PID == before.PID || pidAlive(before.PID) {
			t.Errorf("pytasks after SIGKILL: pid %d (was %d); want a new process", after.PID, before.PID)
		}
	})

	t.Run("SIGTERM of the host: the Python plugins exit by themselves", func(t *testing.T) {
		py := h.plugin(t, "pytasks")
		from := len(log.String())
		stop()
		stopped = true
		after := log.String()[from:]
		for _, pid := range []int{ex.PID, py.PID} {
			if pidAlive(pid) {
				t.Errorf("python plugin pid %d still runs after the host stopped", pid)
			}
		}
		for _, line := range strings.Split(after, "\n") {
			if !strings.Contains(line, "host.pyexample") && !strings.Contains(line, "host.pytasks") {
				continue
			}
			if strings.Contains(line, "failed to exit gracefully") || strings.Contains(line, "killed") || strings.Contains(line, "graceful stop failed") {
				t.Errorf("the host had to kill a Python plugin: %s", line)
			}
		}
		for _, name := range []string{"host.pyexample", "host.pytasks"} {
			if !strings.Contains(after, name+": plugin process exited") {
				t.Errorf("the host log does not say %s's process exited after SIGTERM", name)
			}
		}
	})
}
