package host

// In-process tests of the supervisor against real plugin processes: the
// fixture plugin is built and run, and test hooks put changes exactly
// between two steps of a start.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/internal/testhost"
)

var (
	fixtureOnce sync.Once
	fixturePath string
	fixtureErr  error
)

// fixtureBinary builds host/testdata/fixture once and returns its path.
func fixtureBinary(t *testing.T) string {
	t.Helper()
	fixtureOnce.Do(func() {
		dir, err := os.MkdirTemp("", "taskhost-fixture-")
		if err != nil {
			fixtureErr = err
			return
		}
		fixturePath = filepath.Join(dir, "fixture")
		out, err := exec.Command("go", "build", "-o", fixturePath, "./testdata/fixture").CombinedOutput()
		if err != nil {
			fixtureErr = fmt.Errorf("go build fixture: %v\n%s", err, out)
		}
	})
	if fixtureErr != nil {
		t.Fatal(fixtureErr)
	}
	return fixturePath
}

// installFixture copies the fixture into dir as fp-plugin-<name> and
// returns the copy's path and SHA-256.
func installFixture(t *testing.T, dir, name string) (string, string) {
	t.Helper()
	b, err := os.ReadFile(fixtureBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, BinaryPrefix+name)
	if err := os.WriteFile(path, b, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return path, hex.EncodeToString(sum[:])
}

// startTestHost runs a host in this process on the given config (YAML) and
// stops it when the test ends.
func startTestHost(t *testing.T, yaml string) *Host {
	t.Helper()
	lw := &testLogWriter{t: t}
	t.Cleanup(func() { lw.mu.Lock(); lw.done = true; lw.mu.Unlock() })
	return startTestHostLogging(t, yaml, hclog.New(&hclog.LoggerOptions{Output: lw, Level: hclog.Info}))
}

// startTestHostLogging is startTestHost with the host logging to log.
func startTestHostLogging(t *testing.T, yaml string, log hclog.Logger) *Host {
	t.Helper()
	cfg, err := ParseConfig("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	h := New(cfg, log, "test")
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := h.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return h
}

// testLogWriter sends the host's log to the test's, until the test ends.
type testLogWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func setBeforeExec(t *testing.T, f func(name, path string)) {
	t.Helper()
	beforeExec = f
	t.Cleanup(func() { beforeExec = nil })
}

// TestPinCoversTheBytesThatRun: the binary is swapped by rename() after
// its sha256 pin was checked and before it is started, as an attacker
// racing the host would. The bytes that were checked run, not the
// impostor, which would otherwise pass for the pinned plugin.
func TestPinCoversTheBytesThatRun(t *testing.T) {
	dir := t.TempDir()
	_, sum := installFixture(t, dir, "pinned")
	// The impostor leaves a mark, then runs a genuine copy of the plugin
	// from elsewhere, so it would pass every other check.
	elsewhere := t.TempDir()
	genuine, _ := installFixture(t, elsewhere, "pinned")
	marker := filepath.Join(elsewhere, "impostor-ran")
	impostor := fmt.Sprintf("#!/bin/sh\necho ran > %s\nexec %s \"$@\"\n", marker, genuine)
	swapped := make(chan struct{})
	var once sync.Once
	setBeforeExec(t, func(name, p string) {
		once.Do(func() {
			tmp := filepath.Join(dir, ".swap")
			if err := os.WriteFile(tmp, []byte(impostor), 0o755); err != nil {
				t.Error(err)
			}
			if err := os.Rename(tmp, p); err != nil {
				t.Error(err)
			}
			close(swapped)
		})
	})
	h := startTestHost(t, fmt.Sprintf("plugins_dir: %s\nplugins:\n  pinned:\n    enabled: true\n    sha256: %s\n", dir, sum))
	s, _ := h.Plugin("pinned")
	testhost.WaitFor(t, 60*time.Second, "pinned is running or failed", func() bool {
		st := s.Status().State
		return st == StateRunning || st == StateFailed
	})
	select {
	case <-swapped:
	default:
		t.Fatal("the test hook did not run")
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatalf("the impostor swapped in after the pin was checked ran, and the plugin shows as %+v", s.Status())
	}
	st := s.Status()
	if st.State != StateRunning || !st.Pinned {
		t.Fatalf("pinned: %+v; want it running the verified bytes", st)
	}
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", st.PID)); err != nil || strings.Contains(exe, elsewhere) {
		t.Fatalf("the plugin process runs %q (%v), want the verified binary", exe, err)
	}
}

// TestPinCatchesAWriteIntoTheBinary: the binary's own file is overwritten
// after its pin was checked and before it is started (which takes its
// owner). The process is killed and the plugin failed, not shown as
// running its pinned binary.
func TestPinCatchesAWriteIntoTheBinary(t *testing.T) {
	dir := t.TempDir()
	_, sum := installFixture(t, dir, "pinned")
	elsewhere := t.TempDir()
	genuine, _ := installFixture(t, elsewhere, "pinned")
	impostor := fmt.Sprintf("#!/bin/sh\nexec %s \"$@\"\n", genuine)
	var once sync.Once
	setBeforeExec(t, func(name, p string) {
		once.Do(func() {
			if err := os.WriteFile(p, []byte(impostor), 0o755); err != nil {
				t.Error(err)
			}
		})
	})
	h := startTestHost(t, fmt.Sprintf("plugins_dir: %s\nplugins:\n  pinned:\n    enabled: true\n    sha256: %s\n", dir, sum))
	s, _ := h.Plugin("pinned")
	testhost.WaitFor(t, 60*time.Second, "pinned is running or failed", func() bool {
		st := s.Status().State
		return st == StateRunning || st == StateFailed
	})
	st := s.Status()
	if st.State != StateFailed || !strings.Contains(st.LastError, "was written to while it was being started") {
		t.Fatalf("pinned after a write into its binary between check and start: %s, %q; want failed, saying so", st.State, st.LastError)
	}
}

// TestDiscoverRefusesWhatOthersControl: discovery passes over binaries and
// directories others could change, saying how to fix each.
func TestDiscoverRefusesWhatOthersControl(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root, to give a file to another user: run the tests as root (sudo make test), as CI does")
	}
	dir := t.TempDir()
	write := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("fp-plugin-good", 0o755)
	write("fp-plugin-good_v2", 0o755)
	groupw := write("fp-plugin-groupw", 0o775)
	alien := write("fp-plugin-alien", 0o755)
	if err := os.Chown(alien, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("fp-plugin-good_v2", filepath.Join(dir, "fp-plugin-inside")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/bin/sh", filepath.Join(dir, "fp-plugin-outside")); err != nil {
		t.Fatal(err)
	}
	d, err := Discover(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(d.Names(), " "); got != "good good_v2 inside" {
		t.Errorf("discovered %q, want good good_v2 inside", got)
	}
	warnings := strings.Join(d.Warnings, "\n")
	for _, want := range []string{"chmod go-w " + groupw, "owned by uid 65534", "chown root " + alien, "outside the plugins directory"} {
		if !strings.Contains(warnings, want) {
			t.Errorf("warnings do not say %q:\n%s", want, warnings)
		}
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	d, err = Discover(dir)
	if err != nil || len(d.Binaries) != 0 || len(d.Warnings) != 1 || !strings.Contains(d.Warnings[0], "chmod go-w "+dir) {
		t.Errorf("a world-writable plugins directory: %v, %v, %q; want no binaries and a warning saying chmod go-w", err, d.Binaries, d.Warnings)
	}
}

// TestHealthFrozenPluginInProcess: the supervisor's health checks, which
// run beside its wait, under the race detector: a plugin stopped with
// SIGSTOP is degraded, saying why, and running again when continued.
func TestHealthFrozenPluginInProcess(t *testing.T) {
	dir := t.TempDir()
	installFixture(t, dir, "echo")
	h := startTestHost(t, fmt.Sprintf("plugins_dir: %s\nhealth_interval_seconds: 1\nhung_restart_seconds: 0\nplugins:\n  echo:\n    enabled: true\n", dir))
	s, _ := h.Plugin("echo")
	testhost.WaitFor(t, 60*time.Second, "echo is running", func() bool { return s.Status().State == StateRunning })
	pid := s.Status().PID
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	testhost.WaitFor(t, 60*time.Second, "the frozen echo is degraded", func() bool {
		st := s.Status()
		return st.State == StateDegraded && strings.Contains(st.Health, "not answering its health check for")
	})
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	testhost.WaitFor(t, 60*time.Second, "echo is running again", func() bool {
		st := s.Status()
		return st.State == StateRunning && st.Health == "ok"
	})
	if st := s.Status(); st.PID != pid || st.Restarts != 0 {
		t.Errorf("echo after it was continued: pid %d, restarts %d; want pid %d, not restarted", st.PID, st.Restarts, pid)
	}
}

// TestCheckPluginsDirFollowsLinks: a plugins_dir reached through symbolic
// links is its real directory, and the directories the links are in count
// too.
func TestCheckPluginsDirFollowsLinks(t *testing.T) {
	base := t.TempDir()
	realDir := filepath.Join(base, "real")
	good := filepath.Join(base, "good")
	evil := filepath.Join(base, "evil")
	for dir, mode := range map[string]os.FileMode{realDir: 0o755, good: 0o755, evil: 0o777} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		filepath.Join(base, "link"): "real",
		filepath.Join(good, "link"): "../real",
		filepath.Join(evil, "link"): "../real",
		filepath.Join(good, "hop"):  "../evil/link",
	} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{filepath.Join(base, "link"), filepath.Join(good, "link")} {
		if got, err := checkPluginsDir(dir); err != nil || got != realDir {
			t.Errorf("checkPluginsDir(%s) = %q, %v; want %s", dir, got, err, realDir)
		}
	}
	for _, dir := range []string{filepath.Join(evil, "link"), filepath.Join(good, "hop")} {
		if _, err := checkPluginsDir(dir); err == nil || !strings.Contains(err.Error(), "chmod go-w "+evil) {
			t.Errorf("checkPluginsDir(%s) through the world-writable %s: %v; want it refused, saying chmod go-w", dir, evil, err)
		}
	}
}
