package client_test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// hostURL is the address of the host TestMain starts for the tests and
// the examples: bin/host with tasks_worker on the local store, built
// from this tree.
var hostURL string

// hostLog holds the host's output, printed when a test fails.
var hostLog syncBuffer

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "taskhost-client-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stop, err := startHost(dir)
	code := 1
	if err != nil {
		fmt.Fprintf(os.Stderr, "start a host for the client tests: %v\n%s", err, hostLog.String())
	} else {
		code = m.Run()
		stop()
		if code != 0 {
			fmt.Fprintf(os.Stderr, "host log:\n%s", hostLog.String())
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// startHost builds bin/host and the tasks_worker plugin into dir, starts
// the host on a free loopback port and waits until tasks_worker answers.
func startHost(dir string) (stop func(), err error) {
	plugins := filepath.Join(dir, "plugins")
	builds := map[string]string{
		filepath.Join(dir, "host"):                       "./cmd/host",
		filepath.Join(plugins, "fp-plugin-tasks_worker"): "./plugins/tasksworker/cmd/fp-plugin-tasks_worker",
	}
	for out, pkg := range builds {
		cmd := exec.Command("go", "build", "-o", out, pkg)
		cmd.Dir = ".."
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	config := fmt.Sprintf(`listen: %s
plugins_dir: %s
plugins:
  tasks_worker:
    enabled: true
    config:
      broker: local
      data_dir: %s
      workers: 4
`, addr, plugins, filepath.Join(dir, "var"))
	path := filepath.Join(dir, "taskhost.yaml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(dir, "host"), "-config", path)
	cmd.Stdout, cmd.Stderr = &hostLog, &hostLog
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	hostURL = "http://" + addr
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get(hostURL + "/plugin-pkg/tasks_worker/api/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return stop, nil
			}
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("the host exited before tasks_worker answered")
		default:
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("tasks_worker did not answer /api/health within 90s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
