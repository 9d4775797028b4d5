package host

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseConfigFullExample(t *testing.T) {
	t.Setenv("TASKHOST_TEST_DSN", "postgres://u:p$w@db/x")
	t.Setenv("TASKHOST_TEST_TOKEN", "0123456789abcdef0123")
	cfg, err := ParseConfig("taskhost.yaml", []byte(`
listen: 0.0.0.0:9090
plugins_dir: /opt/plugins
admin_token: ${TASKHOST_TEST_TOKEN}
shutdown_timeout_seconds: 12
restart_budget: 3
plugins:
  tasks_worker:
    enabled: true
    sha256: "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
    env: [TASKHOST_DATABASE_URL]
    config:
      broker: postgres
      dsn: ${TASKHOST_TEST_DSN}
      workers: 8
      unset: ${TASKHOST_SURELY_UNSET_VARIABLE}
  metrics:
    enabled: true
  off:
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "0.0.0.0:9090" || cfg.PluginsDir != "/opt/plugins" || cfg.AdminToken != "0123456789abcdef0123" {
		t.Fatalf("top level = %+v", cfg)
	}
	if cfg.ShutdownTimeout != 12*time.Second || cfg.RestartBudget != 3 || cfg.HealthInterval != 10*time.Second {
		t.Fatalf("durations = %+v", cfg)
	}
	if len(cfg.Plugins) != 3 || cfg.Plugins[0].Name != "tasks_worker" || cfg.Plugins[1].Name != "metrics" || cfg.Plugins[2].Name != "off" {
		t.Fatalf("plugins = %+v", cfg.Plugins)
	}
	tw := cfg.Plugins[0]
	if !tw.Enabled || tw.SHA256 != strings.ToLower("ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789") || tw.Env[0] != "TASKHOST_DATABASE_URL" {
		t.Fatalf("tasks_worker = %+v", tw)
	}
	want := `{"broker":"postgres","dsn":"postgres://u:p$w@db/x","unset":"","workers":8}`
	if string(tw.Config) != want {
		t.Fatalf("config block = %s, want %s", tw.Config, want)
	}
	if cfg.Plugins[2].Enabled || string(cfg.Plugins[2].Config) != "{}" {
		t.Fatalf("a bare plugin entry is disabled with an empty config: %+v", cfg.Plugins[2])
	}
}

func TestParseConfigDefaults(t *testing.T) {
	cfg, err := ParseConfig("x.yaml", []byte("plugins:\n  metrics: {enabled: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != DefaultListen || cfg.PluginsDir != DefaultPluginsDir || cfg.LogLevel != "info" || cfg.MaxBodyBytes != 8<<20 {
		t.Fatalf("defaults = %+v", cfg)
	}
}

func TestParseConfigErrorsNameTheKey(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"empty file", "", "the file is empty"},
		{"not yaml", "listen: [", "not valid YAML"},
		{"top level is a list", "- a\n- b\n", "top level must be a mapping"},
		{"unknown top-level key", "listn: 1.2.3.4:80\n", "listn: unknown setting"},
		{"listen not host:port", "listen: localhost\n", `listen: "localhost" is not host:port`},
		{"listen port out of range", "listen: 127.0.0.1:99999\n", `the port must be a number from 0 to 65535`},
		{"listen port not a port", "listen: 127.0.0.1:nope\n", `neither a number from 0 to 65535 nor a service name`},
		{"admin token of spaces", "admin_token: \"                    \"\n", "admin_token: holds white space"},
		{"two documents", "listen: 127.0.0.1:8080\n---\nlog_level: debug\n", "more than one YAML document"},
		{"public listen without token", "listen: 0.0.0.0:8080\n", "admin_token: required because listen (0.0.0.0:8080) is not a loopback address"},
		{"short token", "admin_token: abc\n", "admin_token: too short"},
		{"enabled not a bool", "plugins:\n  metrics:\n    enabled: yes please\n", `plugins.metrics.enabled: expected true or false, got the string "yes please"`},
		{"bad plugin name", "plugins:\n  Tasks-Worker:\n    enabled: true\n", "plugins.Tasks-Worker: invalid plugin name"},
		{"reserved plugin name", "plugins:\n  host:\n    enabled: true\n", `plugins.host: "host" is reserved`},
		{"prefix collision", "plugins:\n  tasks:\n    enabled: true\n  tasks_worker:\n    enabled: true\n", `plugins.tasks_worker: collides with plugin "tasks"`},
		{"bad sha256", "plugins:\n  metrics:\n    sha256: abc\n", "plugins.metrics.sha256: expected 64 hex digits"},
		{"unknown plugin key", "plugins:\n  metrics:\n    enable: true\n", "plugins.metrics.enable: unknown setting"},
		{"config not a mapping", "plugins:\n  metrics:\n    config: [1, 2]\n", "plugins.metrics.config: expected a mapping"},
		{"env not a list", "plugins:\n  metrics:\n    env: PATH\n", "plugins.metrics.env: expected a list"},
		{"plugins not a mapping", "plugins: [metrics]\n", "plugins: expected a mapping"},
		{"negative budget", "restart_budget: -1\n", "restart_budget: -1 is out of range"},
		{"timeout is text", "shutdown_timeout_seconds: soon\n", "shutdown_timeout_seconds: expected a whole number"},
		{"bad log level", "log_level: loud\n", `log_level: "loud" is not one of`},
		{"key twice", "listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n", "listen: set twice"},
		{"plugin twice", "plugins:\n  metrics: {}\n  metrics: {}\n", "plugins.metrics: configured twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig("bad.yaml", []byte(tt.yaml))
			if err == nil {
				t.Fatalf("accepted a bad config; want an error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "bad.yaml") {
				t.Fatalf("error = %q, want it to start with the file and contain %q", err, tt.want)
			}
		})
	}
}

func TestPrefixCollision(t *testing.T) {
	if _, _, ok := prefixCollision([]string{"metrics", "tasks_worker", "tasks_worker2"}); ok {
		t.Fatal("tasks_worker and tasks_worker2 do not collide: fp_tasks_worker_ vs fp_tasks_worker2_")
	}
	a, b, ok := prefixCollision([]string{"a_b", "x", "a"})
	if !ok || a != "a" || b != "a_b" {
		t.Fatalf("collision = %q %q %v", a, b, ok)
	}
}

func TestIsLoopback(t *testing.T) {
	for host, want := range map[string]bool{"127.0.0.1": true, "::1": true, "localhost": true, "127.8.9.1": true,
		"": false, "0.0.0.0": false, "10.0.0.1": false, "example.com": false} {
		if IsLoopback(host) != want {
			t.Errorf("IsLoopback(%q) != %v", host, want)
		}
	}
}

// A trailing "---" (an empty second document) is not a second document.
func TestParseConfigTrailingDocumentMarker(t *testing.T) {
	for _, src := range []string{"log_level: debug\n---\n", "log_level: debug\n---\n...\n", "log_level: debug\n--- ~\n"} {
		if cfg, err := ParseConfig("taskhost.yaml", []byte(src)); err != nil || cfg.LogLevel != "debug" {
			t.Errorf("%q: %v", src, err)
		}
	}
}

// A value made empty by an unset variable names the variable in its error,
// and every unset variable the file refers to is listed.
func TestParseConfigNamesUnsetVariables(t *testing.T) {
	t.Setenv("TASKHOST_TEST_SET", "debug")
	_, err := ParseConfig("taskhost.yaml", []byte("log_level: ${TASKHOST_TEST_UNSET_LEVEL}\n"))
	if err == nil || !strings.Contains(err.Error(), "${TASKHOST_TEST_UNSET_LEVEL}, which is not set") {
		t.Fatalf("error %v; want it to name the unset variable", err)
	}
	_, err = ParseConfig("taskhost.yaml", []byte("listen: 0.0.0.0:8080\nadmin_token: ${TASKHOST_TEST_UNSET_TOKEN}\n"))
	if err == nil || !strings.Contains(err.Error(), "admin_token refers to ${TASKHOST_TEST_UNSET_TOKEN}, which is not set") {
		t.Fatalf("error %v; want the required admin_token to name its unset variable", err)
	}
	_, err = ParseConfig("taskhost.yaml", []byte("listen: 127.0.0.1:${TASKHOST_TEST_UNSET_PORT}\n"))
	if err == nil || !strings.Contains(err.Error(), "the port is empty") || !strings.Contains(err.Error(), "${TASKHOST_TEST_UNSET_PORT}") {
		t.Fatalf("error %v; want an empty port refused, naming the unset variable", err)
	}
	_, err = ParseConfig("taskhost.yaml", []byte("log_level: \"${TASKHOST_TEST_UNSET_A}${TASKHOST_TEST_UNSET_A}${TASKHOST_TEST_UNSET_B}\"\n"))
	if err == nil || !strings.Contains(err.Error(), "${TASKHOST_TEST_UNSET_A}, ${TASKHOST_TEST_UNSET_B}, which are not set") {
		t.Fatalf("error %v; want both unset variables named once", err)
	}
	cfg, err := ParseConfig("taskhost.yaml", []byte("log_level: ${TASKHOST_TEST_SET}\nadmin_token: ${TASKHOST_TEST_UNSET_TOKEN}\n"))
	if err != nil || cfg.LogLevel != "debug" || !slices.Equal(cfg.UnsetEnv, []string{"TASKHOST_TEST_UNSET_TOKEN"}) {
		t.Fatalf("cfg %+v, %v; want log_level debug and TASKHOST_TEST_UNSET_TOKEN listed as unset", cfg, err)
	}
}

func TestHTTPGuardSettings(t *testing.T) {
	cfg, err := ParseConfig("taskhost.yaml", []byte("listen: 127.0.0.1:8080\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.IdleTimeout != 60*time.Second || cfg.BodyTimeout != 30*time.Second || cfg.MaxConnections != 512 ||
		cfg.MaxConnectionsPerClient != 64 || cfg.AuthMaxFailures != 10 || cfg.AuthLockout != 5*time.Minute || !cfg.PublicReads {
		t.Errorf("defaults: %+v", cfg)
	}
	cfg, err = ParseConfig("taskhost.yaml", []byte("admin_token: 0123456789abcdef0123\npublic_reads: false\nidle_timeout_seconds: 5\n"+
		"body_timeout_seconds: 7\nmax_connections: 64\nmax_connections_per_client: 8\nauth_max_failures: 4\nauth_lockout_seconds: 90\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.IdleTimeout != 5*time.Second || cfg.BodyTimeout != 7*time.Second || cfg.MaxConnections != 64 ||
		cfg.MaxConnectionsPerClient != 8 || cfg.AuthMaxFailures != 4 || cfg.AuthLockout != 90*time.Second || cfg.PublicReads {
		t.Errorf("set: %+v", cfg)
	}
	// Unset, the per-client cap is at most max_connections.
	if cfg, err := ParseConfig("taskhost.yaml", []byte("max_connections: 20\n")); err != nil || cfg.MaxConnectionsPerClient != 20 {
		t.Errorf("max_connections: 20 alone: per-client cap %d, %v; want 20", cfg.MaxConnectionsPerClient, err)
	}
	for text, want := range map[string]string{
		"max_connections: 3\n":                                    "max_connections: 3 is out of range",
		"body_timeout_seconds: 0\n":                               "body_timeout_seconds: 0 is out of range",
		"public_reads: maybe\n":                                   "public_reads: expected true or false",
		"auth_max_failures: 0\n":                                  "auth_max_failures: 0 is out of range",
		"max_connections_per_client: 0\n":                         "max_connections_per_client: 0 is out of range",
		"max_connections: 100\nmax_connections_per_client: 101\n": "max_connections_per_client: 101 is above max_connections (100)",
	} {
		if _, err := ParseConfig("taskhost.yaml", []byte(text)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want %q", text, err, want)
		}
	}
}

// TestListenEnvReplacesTheFilesListen: $TASKHOST_LISTEN (what `make run
// LISTEN=...` sets) replaces the file's listen in LoadConfig, is checked
// as listen is, with errors naming the variable, and decides the
// public_reads default as listen does. ParseConfig ignores it.
func TestListenEnvReplacesTheFilesListen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "taskhost.yaml")
	if err := os.WriteFile(path, []byte("listen: 127.0.0.1:8080\nplugins_dir: bin/plugins\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ env, listen, wantErr string }{
		{"", "127.0.0.1:8080", ""},
		{"127.0.0.1:9090", "127.0.0.1:9090", ""},
		{"[::1]:0", "[::1]:0", ""},
		{"9090", "", `listen: "9090" (from $TASKHOST_LISTEN, which replaces the file's listen) is not host:port`},
		{"127.0.0.1:70000", "", `listen: "127.0.0.1:70000" (from $TASKHOST_LISTEN, which replaces the file's listen): the port must be a number from 0 to 65535`},
		{"0.0.0.0:9090", "", "admin_token: required because listen (0.0.0.0:9090 (from $TASKHOST_LISTEN"},
	} {
		t.Setenv(ListenEnv, tt.env)
		cfg, err := LoadConfig(path)
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("TASKHOST_LISTEN=%q: %v; want an error saying %q", tt.env, err, tt.wantErr)
			}
		case err != nil:
			t.Errorf("TASKHOST_LISTEN=%q: %v", tt.env, err)
		case cfg.Listen != tt.listen || !cfg.PublicReads:
			t.Errorf("TASKHOST_LISTEN=%q: listen %q, public_reads %v; want %q, true", tt.env, cfg.Listen, cfg.PublicReads, tt.listen)
		}
	}
	// A non-loopback address from the variable turns public reads off,
	// as the same address in the file does.
	t.Setenv("TASKHOST_TEST_TOKEN", "0123456789abcdef0123")
	if err := os.WriteFile(path, []byte("admin_token: ${TASKHOST_TEST_TOKEN}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(ListenEnv, "0.0.0.0:9090")
	if cfg, err := LoadConfig(path); err != nil || cfg.Listen != "0.0.0.0:9090" || cfg.PublicReads {
		t.Errorf("a non-loopback TASKHOST_LISTEN with a token: %+v, %v; want listen 0.0.0.0:9090 and public_reads false", cfg, err)
	}
	if cfg, err := ParseConfig(path, []byte("listen: 127.0.0.1:8080\n")); err != nil || cfg.Listen != "127.0.0.1:8080" {
		t.Errorf("ParseConfig with TASKHOST_LISTEN set: %+v, %v; want the file's listen", cfg, err)
	}
}

// TestPluginsDirIsRelativeToTheWorkingDirectory: a relative plugins_dir is
// resolved against the working directory (as `host run` has always
// done), and a missing binary fails the config check naming that
// directory, whatever directory the config file is in.
func TestPluginsDirIsRelativeToTheWorkingDirectory(t *testing.T) {
	work := t.TempDir()
	t.Chdir(work)
	cfg, err := ParseConfig(filepath.Join(t.TempDir(), "taskhost.yaml"), []byte("plugins_dir: plugins\nplugins:\n  metrics: {enabled: true}\n  off: {enabled: false}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.PluginsDirAbs(); got != filepath.Join(work, "plugins") {
		t.Errorf("PluginsDirAbs = %q, want %q", got, filepath.Join(work, "plugins"))
	}
	checks := CheckPluginConfigs(context.Background(), cfg)
	want := "plugins.metrics: no executable fp-plugin-metrics in the plugins directory " + filepath.Join(work, "plugins") +
		" (plugins_dir plugins is relative to the working directory, not to the config file)"
	if len(checks) != 1 || checks[0].Err == nil || !strings.Contains(checks[0].Err.Error(), want) {
		t.Errorf("checks = %+v; want one failure saying %q", checks, want)
	}
	d, err := Discover(cfg.PluginsDir)
	if err != nil || len(d.Binaries) != 0 || len(d.Warnings) != 1 || !strings.Contains(d.Warnings[0], "plugins directory "+filepath.Join(work, "plugins")+" does not exist") {
		t.Errorf("Discover = %+v, %v; want a warning naming %s", d, err, filepath.Join(work, "plugins"))
	}
}
