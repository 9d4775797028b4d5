package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/internal/testdb"
)

// TestCommandLineClient drives a running host with `host tasks|reclaim|
// schedules|plugins`, as a script or an operator would.
func TestCommandLineClient(t *testing.T) {
	h := startHost(t, `
listen: LISTEN
plugins_dir: PLUGINS
plugins:
  tasks_worker:
    enabled: true
    config:
      broker: memory
      schedules:
        - {name: nightly, task: demo.echo, cron: "0 3 * * *"}
  metrics:
    enabled: true
`)
	h.waitState(t, "tasks_worker", "running", 30*time.Second)
	// Until the metrics plugin has started, the host cannot say it
	// provides no tasks, and a submit of an unknown task waits for it.
	h.waitState(t, "metrics", "running", 30*time.Second)
	cli := func(args ...string) (string, error) {
		words := 1
		if args[0] == "tasks" || args[0] == "schedules" {
			words = 2 // the subcommand comes before the flags
		}
		full := append(append(append([]string{}, args[:words]...), "-addr", h.base), args[words:]...)
		out, err := exec.Command(filepath.Join(binDir, "host"), full...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	id, err := cli("tasks", "submit", "-task", "demo.echo", "-payload", `{"from": "cli"}`)
	if err != nil || id == "" {
		t.Fatalf("tasks submit: %v %s", err, id)
	}
	var got string
	waitFor(t, 60*time.Second, "the task is done", func() bool {
		got, err = cli("tasks", "get", id)
		return err == nil && strings.Contains(got, "done")
	})
	if !strings.Contains(got, `{"from":"cli"}`) {
		t.Fatalf("tasks get:\n%s", got)
	}
	if out, err := cli("tasks", "list", "-state", "done"); err != nil || !strings.Contains(out, "demo.echo") {
		t.Fatalf("tasks list: %v\n%s", err, out)
	}
	if out, err := cli("tasks", "submit", "-task", "nope"); err == nil || !strings.Contains(out, `unknown task "nope"`) {
		t.Fatalf("submitting an unknown task: %v\n%s", err, out)
	}
	if out, err := cli("reclaim"); err != nil || !strings.Contains(out, "memory broker cannot orphan") {
		t.Fatalf("reclaim: %v\n%s", err, out)
	}
	if out, err := cli("schedules", "list"); err != nil || !strings.Contains(out, "nightly") || !strings.Contains(out, "0 3 * * *") {
		t.Fatalf("schedules list: %v\n%s", err, out)
	}
	if out, err := cli("plugins"); err != nil || !strings.Contains(out, "tasks_worker") || !strings.Contains(out, "running") {
		t.Fatalf("plugins: %v\n%s", err, out)
	}
	if out, err := cli("plugins", "-json"); err != nil || !strings.Contains(out, `"capabilities"`) {
		t.Fatalf("plugins -json: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(binDir, "host"), "plugins", "-addr", "http://127.0.0.1:1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "cannot reach the host") {
		t.Fatalf("unreachable host: %v\n%s", err, out)
	}
}

// TestCheckConfigChecksPluginBlocks: `host check-config` has each enabled
// plugin binary check its own config block: a bad tasks_worker setting or
// schedule fails the check naming the key, a good file passes, a plugin
// that cannot check offline is reported as not checked rather than as ok,
// and an enabled plugin without a binary fails the check.
func TestCheckConfigChecksPluginBlocks(t *testing.T) {
	check := func(config string) (string, error) {
		path := filepath.Join(t.TempDir(), "taskhost.yaml")
		if err := os.WriteFile(path, []byte(strings.ReplaceAll(config, "PLUGINS", pluginsDir)), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(filepath.Join(binDir, "host"), "check-config", "-config", path).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	cases := []struct{ name, block, want string }{
		{"unknown broker", "{broker: nosuch}", "plugins.tasks_worker.config.broker: unknown broker"},
		{"negative workers", "{workers: -3}", "plugins.tasks_worker.config.workers: must be a whole number from 1 to 1000"},
		{"unknown key", "{bogus_key: 1}", "plugins.tasks_worker.config.bogus_key: unknown setting"},
		{"bad cron", `{schedules: [{name: n, task: demo.echo, cron: "bad cron"}]}`, "plugins.tasks_worker.config.schedules[0]:"},
		{"bad dsn", `{broker: postgres, dsn: "not a dsn"}`, "plugins.tasks_worker.config.dsn: the dsn does not parse"},
	}
	for _, c := range cases {
		out, err := check("plugins_dir: PLUGINS\nplugins:\n  tasks_worker:\n    enabled: true\n    config: " + c.block + "\n")
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("%s: check-config = %v\n%s\nwant a failure saying %q", c.name, err, out, c.want)
		}
	}
	// A binary that does not match its pin is not run.
	out, err := check("plugins_dir: PLUGINS\nplugins:\n  tasks_worker:\n    enabled: true\n    sha256: " + strings.Repeat("0", 64) + "\n")
	if err == nil || !strings.Contains(out, "plugins.tasks_worker.sha256") || !strings.Contains(out, "does not match its sha256 pin") || !strings.Contains(out, "not run") {
		t.Errorf("a pinned binary that does not match: check-config = %v\n%s", err, out)
	}
	out, err = check(`plugins_dir: PLUGINS
plugins:
  tasks_worker:
    enabled: true
    config: {broker: memory, schedules: [{name: n, task: demo.echo, cron: "0 3 * * *"}]}
  metrics:
    enabled: true
  nobinary:
    enabled: false
`)
	if err != nil || !strings.Contains(out, "plugins.tasks_worker.config: ok") ||
		!strings.Contains(out, "plugins.metrics.config: not checked: the plugin checks its config only when it starts") ||
		strings.Contains(out, "nobinary") {
		t.Errorf("a good file (a disabled plugin needs no binary): check-config = %v\n%s", err, out)
	}
	// An enabled plugin without a binary would not start: the check fails.
	out, err = check("plugins_dir: PLUGINS\nplugins:\n  metrics:\n    enabled: true\n  nobinary:\n    enabled: true\n")
	if err == nil || !strings.Contains(out, "plugins.nobinary: no executable fp-plugin-nobinary in the plugins directory "+pluginsDir+";") ||
		strings.Contains(out, ": ok (") {
		t.Errorf("an enabled plugin without a binary: check-config = %v\n%s\nwant a failure naming %s", err, out, pluginsDir)
	}
}

// TestCheckConfigResolvesPluginsDirAsRunDoes: a relative plugins_dir is
// relative to the working directory, for `host check-config` as for `host
// run`, whatever directory the config file is in. From the right
// directory the check finds and runs the plugins; from another it fails,
// naming the directory it looked in, instead of saying ok.
func TestCheckConfigResolvesPluginsDirAsRunDoes(t *testing.T) {
	path := writeConfig(t, "plugins_dir: "+filepath.Base(pluginsDir)+`
plugins:
  tasks_worker:
    enabled: true
    config: {broker: memory}
`)
	checkFrom := func(dir string) (string, error) {
		cmd := exec.Command(filepath.Join(binDir, "host"), "check-config", "-config", path)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := checkFrom(filepath.Dir(pluginsDir)); err != nil || !strings.Contains(out, "plugins.tasks_worker.config: ok") {
		t.Errorf("from the directory holding %s: check-config = %v\n%s", filepath.Base(pluginsDir), err, out)
	}
	elsewhere := filepath.Dir(path) // the config file's own directory has no plugins
	want := "no executable fp-plugin-tasks_worker in the plugins directory " + filepath.Join(elsewhere, filepath.Base(pluginsDir)) +
		" (plugins_dir " + filepath.Base(pluginsDir) + " is relative to the working directory, not to the config file)"
	if out, err := checkFrom(elsewhere); err == nil || !strings.Contains(out, want) || strings.Contains(out, ": ok") {
		t.Errorf("from a directory without the plugins: check-config = %v\n%s\nwant a failure saying %q", err, out, want)
	}
}

// runCLI runs the built host with args and env added to the test's
// environment, and returns its standard output, standard error and exit
// status.
func runCLI(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "host"), args...)
	cmd.Dir = t.TempDir() // no taskhost.yaml, no bin/plugins here
	cmd.Env = append(os.Environ(), env...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("host %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errOut.String(), code
}

// writeConfig writes a host config file (PLUGINS replaced by the plugins
// directory) and returns its path.
func writeConfig(t *testing.T, config string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "taskhost.yaml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(config, "PLUGINS", pluginsDir)), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestMigrateRunsInTheTasksWorkerBinary: `host migrate` runs in the
// tasks_worker plugin binary that plugins_dir of -config names, which takes
// the DSN and schema from that config's tasks_worker block (handed to it on
// stdin), and is not run from a binary that does not match its pin. (`host
// bench` runs the bench's own binary: bench/cmd/taskhost-bench tests it.)
func TestMigrateRunsInTheTasksWorkerBinary(t *testing.T) {
	schema := pgSchema(t)
	cfg := writeConfig(t, "plugins_dir: PLUGINS\nplugins:\n  tasks_worker:\n    enabled: true\n    config: {broker: postgres, dsn: \""+testdb.DSN()+"\", schema: "+schema+"}\n")
	noDB := []string{"TASKHOST_DATABASE_URL="}
	out, errOut, code := runCLI(t, noDB, "migrate", "-config", cfg)
	if code != 0 || strings.TrimSpace(out) != "migrated: schema "+schema+" is up to date" {
		t.Fatalf("migrate: status %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	var n int
	if err := pgConn(t, schema).QueryRow(context.Background(), `SELECT count(*) FROM tw_schema_migrations`).Scan(&n); err != nil || n == 0 {
		t.Fatalf("after migrate: %d migrations recorded in %s (%v)", n, schema, err)
	}
	empty := writeConfig(t, "plugins_dir: PLUGINS\n")
	if _, errOut, code = runCLI(t, noDB, "migrate", "-config="+empty); code != 2 || !strings.Contains(errOut, "host migrate: no database: pass -dsn") {
		t.Errorf("migrate without a database: status %d, stderr:\n%s", code, errOut)
	}
	if _, errOut, code = runCLI(t, noDB, "migrate", "-dsn", "postgres://nobody@127.0.0.1:1/x", "-config", empty); code != 1 || !strings.HasPrefix(errOut, "host migrate: ") {
		t.Errorf("migrate with an unreachable database: status %d, stderr:\n%s", code, errOut)
	}
	pinned := writeConfig(t, "plugins_dir: PLUGINS\nplugins:\n  tasks_worker:\n    enabled: true\n    sha256: "+strings.Repeat("0", 64)+"\n")
	if _, errOut, code = runCLI(t, noDB, "migrate", "-config", pinned, "-dsn", testdb.DSN()); code != 1 || !strings.Contains(errOut, "does not match its sha256 pin") || !strings.Contains(errOut, "not run") {
		t.Errorf("migrate from a binary that does not match its pin: status %d, stderr:\n%s", code, errOut)
	}
	elsewhere := writeConfig(t, "plugins_dir: "+t.TempDir()+"\n")
	if _, errOut, code = runCLI(t, noDB, "migrate", "-config", elsewhere, "-dsn", testdb.DSN()); code != 1 || !strings.Contains(errOut, "make build") || !strings.Contains(errOut, "the plugins_dir of "+elsewhere) {
		t.Errorf("migrate without the plugin binary: status %d, stderr:\n%s", code, errOut)
	}
}
