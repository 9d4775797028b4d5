package main

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/taskhost/taskhost/internal/testhost"
)

// TestHostBenchRunsTheBenchBinary: `host bench` runs the bench's binary
// beside the host binary, with its flags, output and exit statuses, and
// says how to build it when it is missing.
func TestHostBenchRunsTheBenchBinary(t *testing.T) {
	dir := t.TempDir()
	if err := testhost.Build(dir); err != nil {
		t.Fatal(err)
	}
	hostBench := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		cmd := exec.Command(filepath.Join(dir, "host"), append([]string{"bench"}, args...)...)
		cmd.Dir = t.TempDir()
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			code = ee.ExitCode()
		default:
			t.Fatalf("host bench %s: %v", strings.Join(args, " "), err)
		}
		return out.String(), errOut.String(), code
	}
	if _, errOut, code := hostBench("-broker", "memory"); code != 1 || !strings.Contains(errOut, "no executable "+filepath.Join(dir, "taskhost-bench")) || !strings.Contains(errOut, "make build") {
		t.Errorf("host bench without the bench binary: status %d, stderr:\n%s", code, errOut)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "taskhost-bench"), ".")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	out, errOut, code := hostBench("-broker", "memory", "-jobs", "200", "-workers", "4", "-rate", "200", "-duration", "200ms", "-runs", "1")
	if code != 0 || !strings.Contains(out, "== medians of 1 runs") || !strings.Contains(out, "== summary (JSON)\n{\"broker\":\"memory\"") {
		t.Fatalf("host bench: status %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if _, errOut, code = hostBench("-broker", "nosuch"); code != 2 || !strings.Contains(errOut, `host bench: unknown broker "nosuch"`) {
		t.Errorf("host bench -broker nosuch: status %d, stderr:\n%s", code, errOut)
	}
	if _, errOut, code = hostBench("-h"); code != 0 || !strings.Contains(errOut, "usage: host bench [flags]") || !strings.Contains(errOut, "-claim-latency") {
		t.Errorf("host bench -h: status %d, stderr:\n%s", code, errOut)
	}
}
