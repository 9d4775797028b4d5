package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/taskhost/taskhost/broker"
)

// runCLI runs the command line with stdin and returns its exit status,
// standard output and standard error.
func runCLI(stdin string, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	cl := &cli{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut}
	code := cl.run(args)
	return code, out.String(), errOut.String()
}

func TestParseInterleaved(t *testing.T) {
	cases := []struct {
		name string
		args []string
		pos  []string
		json bool
	}{
		{"flags after the argument", []string{"17", "-json"}, []string{"17"}, true},
		{"flags before the argument", []string{"-json", "17"}, []string{"17"}, true},
		{"flags around arguments", []string{"-limit", "3", "a", "-json", "b"}, []string{"a", "b"}, true},
		{"after -- everything is an argument", []string{"a", "--", "-json"}, []string{"a", "-json"}, false},
		{"a lone - is an argument", []string{"-", "-json"}, []string{"-"}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			js := fs.Bool("json", false, "")
			fs.Int("limit", 0, "")
			pos, err := parseInterleaved(fs, c.args)
			if err != nil || !slices.Equal(pos, c.pos) || *js != c.json {
				t.Fatalf("parseInterleaved(%q) = %q, json %v, %v; want %q, json %v", c.args, pos, *js, err, c.pos, c.json)
			}
		})
	}
}

// fakeHost answers GET tasks/17 and the NDJSON batch upload as the
// tasks_worker API does: a chunk line per 2 lines, a task named "bad"
// stops the upload.
func fakeHost(t *testing.T) string {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /plugin-pkg/tasks_worker/api/tasks/17", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"id":"17","task":"demo.echo","topic":"default","state":"done","attempts":1,"max_attempts":3,"created_at":"2026-01-02T03:04:05Z","result":{"ok":true}}`)
	})
	mux.HandleFunc("GET /plugin-pkg/tasks_worker/api/tasks/{id}", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(404)
		_, _ = io.WriteString(w, `{"error":"no task with id 18"}`)
	})
	// POST tasks answers an id that spells the intake fields it got, or,
	// for the unique key "held", a duplicate of task 7.
	mux.HandleFunc("POST /plugin-pkg/tasks_worker/api/tasks", func(w http.ResponseWriter, r *http.Request) {
		var item struct {
			Priority         int      `json:"priority"`
			RunAt            string   `json:"run_at"`
			UniqueKey        string   `json:"unique_key"`
			UniqueForSeconds float64  `json:"unique_for_seconds"`
			UniqueStates     []string `json:"unique_states"`
		}
		_ = json.NewDecoder(r.Body).Decode(&item)
		if item.UniqueKey == "held" {
			_, _ = io.WriteString(w, `{"id":"7","duplicate":true}`)
			return
		}
		w.WriteHeader(201)
		_ = json.NewEncoder(w).Encode(map[string]string{"id": fmt.Sprintf("%d|%s|%s|%v|%v", item.Priority, item.RunAt, item.UniqueKey, item.UniqueForSeconds, item.UniqueStates)})
	})
	mux.HandleFunc("POST /plugin-pkg/tasks_worker/api/tasks/batch", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Content-Type") != "application/x-ndjson" {
			http.Error(w, "not ndjson", 400)
			return
		}
		sc := bufio.NewScanner(r.Body)
		enc := json.NewEncoder(w)
		line, stored, id := 0, 0, 100
		var ids []string
		first := 1
		flush := func() {
			if len(ids) > 0 {
				_ = enc.Encode(map[string]any{"first_line": first, "last_line": line, "ids": ids})
				stored += len(ids)
			}
			ids, first = nil, line+1
		}
		for sc.Scan() {
			line++
			var item struct{ Task string }
			if strings.TrimSpace(sc.Text()) == "" {
				continue
			}
			if json.Unmarshal(sc.Bytes(), &item) != nil || item.Task == "bad" {
				line--
				flush()
				_ = enc.Encode(map[string]any{"done": false, "stored": stored, "line": line + 1, "error": fmt.Sprintf("line %d: unknown task %q", line+1, item.Task)})
				return
			}
			id++
			ids = append(ids, fmt.Sprint(id))
			if len(ids) == 2 {
				flush()
			}
		}
		flush()
		_ = enc.Encode(map[string]any{"done": true, "stored": stored, "lines": line})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestClientCommands(t *testing.T) {
	addr := fakeHost(t)
	ndjson := "{\"task\":\"demo.echo\"}\n\n{\"task\":\"demo.echo\"}\n{\"task\":\"demo.echo\"}\n"
	cases := []struct {
		name     string
		stdin    string
		args     []string
		code     int
		stdout   []string
		stderr   []string
		noStdout bool
	}{
		{name: "get with flags after the id", args: []string{"tasks", "get", "17", "-addr", addr},
			stdout: []string{"state", "done", "attempts", "1 of 3", `{"ok":true}`}},
		{name: "wait on a done task", args: []string{"tasks", "wait", "-addr", addr, "17"},
			stdout: []string{"done"}},
		{name: "get -json after the id", args: []string{"tasks", "get", "17", "-json", "-addr", addr},
			stdout: []string{`"id": "17"`, `"state": "done"`}},
		{name: "a missing task is the host's message and exit 1", args: []string{"tasks", "get", "18", "-addr", addr},
			code: 1, stderr: []string{"host tasks get: no task with id 18 (HTTP 404)"}, noStdout: true},
		{name: "submit -file - streams standard input", stdin: ndjson, args: []string{"tasks", "submit", "-addr", addr, "-file", "-"},
			stderr: []string{"stored 3 tasks from 4 lines of standard input"}, noStdout: true},
		{name: "submit -file - -ids prints the ids", stdin: ndjson, args: []string{"tasks", "submit", "-file", "-", "-ids", "-addr", addr},
			stdout: []string{"101\n102\n103\n"}},
		{name: "a bad line stops the upload, named, exit 1", stdin: ndjson + "{\"task\":\"bad\"}\n{\"task\":\"demo.echo\"}\n",
			args: []string{"tasks", "submit", "-addr", addr, "-file", "-"}, code: 1,
			stderr: []string{"standard input: stopped at line 5", `unknown task "bad"`, "the 3 tasks before it are stored", "tail -n +5"}},
		{name: "a file that is not there", args: []string{"tasks", "submit", "-addr", addr, "-file", filepath.Join(t.TempDir(), "none.ndjson")},
			code: 1, stderr: []string{"no such file"}},
		{name: "-file and -task do not go together", args: []string{"tasks", "submit", "-file", "-", "-task", "demo.echo"},
			code: 2, stderr: []string{"-task and -file do not go together"}},
		{name: "submit without -task or -file", args: []string{"tasks", "submit"},
			code: 2, stderr: []string{"-task NAME or -file FILE is required"}},
		{name: "submit sends priority, run-at and the unique key's fields",
			args: []string{"tasks", "submit", "-addr", addr, "-task", "demo.echo", "-priority", "5", "-run-at", "2030-01-02T03:04:05Z",
				"-unique-key", "k", "-unique-for", "60", "-unique-states", "queued,running,done"},
			stdout: []string{"5|2030-01-02T03:04:05Z|k|60|[queued running done]\n"}},
		{name: "a duplicate prints the holder and says so", args: []string{"tasks", "submit", "-addr", addr, "-task", "demo.echo", "-unique-key", "held"},
			stdout: []string{"7\n"}, stderr: []string{`duplicate: task 7 holds unique key "held"; nothing was stored`}},
		{name: "a duplicate in JSON", args: []string{"tasks", "submit", "-addr", addr, "-task", "demo.echo", "-unique-key", "held", "-json"},
			stdout: []string{`"duplicate": true`, `"id": "7"`}},
		{name: "a run-at that is no time", args: []string{"tasks", "submit", "-addr", addr, "-task", "demo.echo", "-run-at", "tomorrow"},
			code: 2, stderr: []string{`-run-at "tomorrow" is not an RFC 3339 time`}},
		{name: "-file and -priority do not go together", args: []string{"tasks", "submit", "-file", "-", "-priority", "3"},
			code: 2, stderr: []string{"-priority and -file do not go together"}},
		{name: "-limit 0 is refused", args: []string{"tasks", "list", "-addr", addr, "-limit", "0"},
			code: 2, stderr: []string{"-limit must be from 1 to 1000, got 0"}},
		{name: "-limit over 1000 is refused", args: []string{"tasks", "list", "-addr", addr, "-limit", "1001"},
			code: 2, stderr: []string{"-limit must be from 1 to 1000, got 1001"}},
		{name: "-ids without -file is refused", args: []string{"tasks", "submit", "-addr", addr, "-ids", "-task", "demo.echo"},
			code: 2, stderr: []string{"-ids goes only with -file"}},
		{name: "get without an id", args: []string{"tasks", "get"}, code: 2, stderr: []string{"takes 1 argument(s) (ID), got 0"}},
		{name: "an unknown flag", args: []string{"tasks", "list", "-bogus"}, code: 2, stderr: []string{"flag provided but not defined: -bogus"}},
		{name: "an unknown tasks command", args: []string{"tasks", "frobnicate"}, code: 2, stderr: []string{`unknown command "frobnicate"`, "host tasks submit"}},
		{name: "tasks alone lists its commands", args: []string{"tasks"}, code: 2, stderr: []string{"say which command", "host tasks wait ID"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runCLI(c.stdin, c.args...)
			if code != c.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, c.code, out, errOut)
			}
			for _, s := range c.stdout {
				if !strings.Contains(out, s) {
					t.Errorf("stdout lacks %q:\n%s", s, out)
				}
			}
			for _, s := range c.stderr {
				if !strings.Contains(errOut, s) {
					t.Errorf("stderr lacks %q:\n%s", s, errOut)
				}
			}
			if c.noStdout && out != "" {
				t.Errorf("stdout should be empty:\n%s", out)
			}
		})
	}
}

// TestHelpListsEverything: `host help`, `host -h` and `host tasks -h`
// list every command and every flag, on standard output, exit 0.
func TestHelpListsEverything(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		code, out, _ := runCLI("", args...)
		if code != 0 {
			t.Fatalf("host %v: exit %d", args, code)
		}
		for _, want := range []string{"host [run] [-config FILE]", "host check-config", "host migrate", "host bench", "host version", "exit status"} {
			if !strings.Contains(out, want) {
				t.Errorf("host %v lacks %q", args, want)
			}
		}
		for i := range clientCommands {
			cmd := &clientCommands[i]
			if !strings.Contains(out, "host "+cmd.name) {
				t.Errorf("host %v lacks the command %q", args, cmd.name)
			}
			fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
			addCommonFlags(fs, cmd.noTimeout)
			cmd.setup(fs)
			fs.VisitAll(func(f *flag.Flag) {
				if !strings.Contains(out, "-"+f.Name+" ") {
					t.Errorf("host %v lacks the flag -%s of %q", args, f.Name, cmd.name)
				}
			})
		}
	}
	code, out, _ := runCLI("", "tasks", "-h")
	if code != 0 || !strings.Contains(out, "host tasks submit") || !strings.Contains(out, "-file FILE") || !strings.Contains(out, "host tasks list") || strings.Contains(out, "host schedules") {
		t.Fatalf("host tasks -h: exit %d\n%s", code, out)
	}
	code, out, _ = runCLI("", "tasks", "get", "-h")
	if code != 0 || !strings.Contains(out, "host tasks get ID") || !strings.Contains(out, "-addr URL") {
		t.Fatalf("host tasks get -h: exit %d\n%s", code, out)
	}
}

// TestNoConfigFileSaysWhatToDo: the host without a config file says how
// to give one.
func TestNoConfigFileSaysWhatToDo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "taskhost.yaml")
	for _, args := range [][]string{{"-config", path}, {"check-config", "-config", path}} {
		code, _, errOut := runCLI("", args...)
		if code != 1 {
			t.Fatalf("host %v: exit %d, want 1", args, code)
		}
		for _, want := range []string{"no such file", "-config FILE", "$TASKHOST_CONFIG", "make run", "examples/taskhost.yaml"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("host %v: stderr lacks %q:\n%s", args, want, errOut)
			}
		}
	}
}

// TestClientConfigFile: a client command takes the address and token the
// flags leave out from the config file. A file named with -config or
// $TASKHOST_CONFIG that cannot be read or is invalid is a mistake in the
// command line (exit 2, naming the file and the problem), never a silent
// fall back to 127.0.0.1:8080 without a token; only a missing default
// taskhost.yaml means no config.
func TestClientConfigFile(t *testing.T) {
	addr := fakeHost(t)
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good := write("good.yaml", "listen: "+strings.TrimPrefix(addr, "http://")+"\n")
	bad := write("bad.yaml", "listen: 127.0.0.1:18084\nbogus_key: 1\n")
	unsetEnv := write("unset.yaml", "listen: 0.0.0.0:18084\nadmin_token: ${TASKHOST_TEST_UNSET_TOKEN}\n")
	missing := filepath.Join(dir, "none.yaml")
	t.Setenv("TASKHOST_ADMIN_TOKEN", "")
	t.Setenv("TASKHOST_LISTEN", "")
	t.Setenv("TASKHOST_TEST_UNSET_TOKEN", "")
	os.Unsetenv("TASKHOST_TEST_UNSET_TOKEN")

	cases := []struct {
		name      string
		configEnv string
		args      []string
		code      int
		stderr    []string
	}{
		{name: "-config gives the address", args: []string{"tasks", "get", "17", "-config", good}},
		{name: "$TASKHOST_CONFIG gives the address", configEnv: good, args: []string{"tasks", "get", "17"}},
		{name: "-config with an unknown key", args: []string{"tasks", "list", "-config", bad},
			code: 2, stderr: []string{bad + ":2: bogus_key: unknown setting", "-config FILE"}},
		{name: "-config that is not there", args: []string{"tasks", "list", "-config", missing},
			code: 2, stderr: []string{missing, "no such file"}},
		{name: "-config invalid for an unset variable", args: []string{"tasks", "list", "-config", unsetEnv},
			code: 2, stderr: []string{unsetEnv + ":1: admin_token", "${TASKHOST_TEST_UNSET_TOKEN}, which is not set"}},
		{name: "$TASKHOST_CONFIG that is not there", configEnv: missing, args: []string{"tasks", "list", "-addr", addr},
			code: 2, stderr: []string{missing, "no such file"}},
		{name: "$TASKHOST_CONFIG that is invalid", configEnv: bad, args: []string{"tasks", "list"},
			code: 2, stderr: []string{bad + ":2: bogus_key"}},
		{name: "-addr and -token need no config", args: []string{"tasks", "get", "17", "-config", missing, "-addr", addr, "-token", "t"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("TASKHOST_CONFIG", c.configEnv)
			code, out, errOut := runCLI("", c.args...)
			if code != c.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, c.code, out, errOut)
			}
			for _, s := range c.stderr {
				if !strings.Contains(errOut, s) {
					t.Errorf("stderr lacks %q:\n%s", s, errOut)
				}
			}
			if c.code == 0 && !strings.Contains(out, "done") {
				t.Errorf("stdout lacks the task:\n%s", out)
			}
		})
	}

	// The default taskhost.yaml: missing, it is no config; there but
	// invalid, it is an error as a named one is.
	t.Setenv("TASKHOST_CONFIG", "")
	t.Chdir(t.TempDir())
	if code, out, errOut := runCLI("", "tasks", "get", "17", "-addr", addr); code != 0 {
		t.Fatalf("no taskhost.yaml: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if err := os.WriteFile("taskhost.yaml", []byte("bogus_key: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := runCLI("", "tasks", "get", "17", "-addr", addr); code != 2 || !strings.Contains(errOut, "taskhost.yaml:1: bogus_key") {
		t.Fatalf("an invalid taskhost.yaml: exit %d, want 2\nstderr:\n%s", code, errOut)
	}
}

// TestListLimitIsTheBrokers: -limit's range is the API's.
func TestListLimitIsTheBrokers(t *testing.T) {
	if maxListLimit != broker.MaxListLimit {
		t.Fatalf("maxListLimit is %d, broker.MaxListLimit %d", maxListLimit, broker.MaxListLimit)
	}
}

// TestListenEnvBeforeTheConfigFile: $TASKHOST_LISTEN replaces the listen
// of -config's file, for the client commands as for the host, and -addr's
// help says so.
func TestListenEnvBeforeTheConfigFile(t *testing.T) {
	addr := fakeHost(t)
	path := filepath.Join(t.TempDir(), "taskhost.yaml")
	if err := os.WriteFile(path, []byte("listen: 127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TASKHOST_LISTEN", strings.TrimPrefix(addr, "http://"))
	t.Setenv("TASKHOST_ADMIN_TOKEN", "")
	if code, out, errOut := runCLI("", "tasks", "get", "17", "-config", path); code != 0 || !strings.Contains(out, "done") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	_, out, _ := runCLI("", "tasks", "get", "-h")
	if !strings.Contains(out, "default: $TASKHOST_LISTEN, else the listen of -config's file, else 127.0.0.1:8080") {
		t.Fatalf("-addr's help does not give the order of $TASKHOST_LISTEN and the file:\n%s", out)
	}
}
