// Package testhost gives tests a real host: bin/host and the tasks_worker
// plugin built from this tree, started on a free loopback port with the
// configuration a test gives, a log sink safe for concurrent writers, and
// a poll that waits for a condition.
package testhost

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/internal/hostproc"
)

// SyncBuffer is a bytes buffer safe for concurrent writers: a process's
// or a logger's output, read by a test for assertions or on failure.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitPoll is how often WaitFor calls its condition: often enough that a
// wait ends soon after the condition holds, seldom enough that polling
// the host does not load it.
const waitPoll = 50 * time.Millisecond

// WaitFor calls cond every waitPoll until it returns true, and fails the
// test (t.Fatalf, naming what) when it has not after timeout.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", timeout, what)
		}
		time.Sleep(waitPoll)
	}
}

// Build builds bin/host into dir/host and the tasks_worker plugin into
// dir/plugins/fp-plugin-tasks_worker, from the product's module: the one
// this test runs in, or the one above it (the bench's module is nested in
// the product's).
func Build(dir string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	builds := map[string]string{
		filepath.Join(dir, "host"):                              "./cmd/host",
		filepath.Join(dir, "plugins", "fp-plugin-tasks_worker"): "./plugins/tasksworker/cmd/fp-plugin-tasks_worker",
		filepath.Join(dir, "plugins", "fp-plugin-example"):      "./plugins/example/cmd/fp-plugin-example",
	}
	for out, pkg := range builds {
		cmd := exec.Command("go", "build", "-o", out, pkg)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	return nil
}

// moduleRoot is the nearest directory above the working directory whose
// go.mod is the product's module, github.com/taskhost/taskhost.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && productModule(b) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod of github.com/taskhost/taskhost above the working directory")
		}
		dir = parent
	}
}

// productModule reports whether the go.mod file gomod declares the
// product's module.
func productModule(gomod []byte) bool {
	for _, line := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`) == "github.com/taskhost/taskhost"
		}
	}
	return false
}

// Start runs the host Build put in dir on a free loopback port and waits
// until tasks_worker answers /api/health. The configuration file is
// "listen" and "plugins_dir" followed by config, in which {{dir}} stands
// for dir. The host's output goes to log. stop sends SIGTERM and waits for
// the host to exit (killing it after 60 s).
func Start(dir, config string, log *SyncBuffer) (url string, stop func(), err error) {
	p, err := hostproc.Start(context.Background(), hostproc.Options{
		Host:       filepath.Join(dir, "host"),
		PluginsDir: filepath.Join(dir, "plugins"),
		ConfigPath: filepath.Join(dir, "taskhost.yaml"),
		Config:     strings.ReplaceAll(config, "{{dir}}", dir),
		Output:     log,
	})
	if err != nil {
		return "", nil, err
	}
	return p.URL, p.Stop, nil
}

// Main is a TestMain for tests that talk to one real host: it builds and
// starts a host with config (as Start takes it) in a temporary directory,
// sets *url to its address, runs the tests, stops the host and exits. The
// host's log is printed when it does not start or a test fails; what
// names the tests in the message when it does not start.
func Main(m *testing.M, what, config string, url *string) {
	dir, err := os.MkdirTemp("", "taskhost-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var log SyncBuffer
	var stop func()
	err = Build(dir)
	if err == nil {
		*url, stop, err = Start(dir, config, &log)
	}
	code := 1
	if err != nil {
		fmt.Fprintf(os.Stderr, "start a host for %s: %v\n%s", what, err, log.String())
	} else {
		code = m.Run()
		stop()
		if code != 0 {
			fmt.Fprintf(os.Stderr, "host log:\n%s", log.String())
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// LocalTasksWorker is a configuration for Start and Main: tasks_worker on
// the local store under dir/var with 4 workers. Lines appended to it go
// into tasks_worker's config, indented by six spaces.
const LocalTasksWorker = `plugins:
  tasks_worker:
    enabled: true
    config:
      broker: local
      data_dir: {{dir}}/var
      workers: 4
`
