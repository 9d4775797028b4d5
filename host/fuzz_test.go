package host

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

// FuzzParseConfig: any file either parses or is refused with a
// *ConfigError that names the file; nothing panics, and ${NAME}
// references expand from the environment without ever expanding twice.
func FuzzParseConfig(f *testing.F) {
	for _, seed := range []string{
		"listen: 127.0.0.1:8080\nplugins:\n  metrics: {enabled: true}\n",
		"admin_token: ${FUZZ_TOKEN}\nlisten: 0.0.0.0:80\n",
		"plugins:\n  tasks_worker:\n    enabled: true\n    env: [A, B]\n    config: {broker: memory, workers: 8}\n",
		"plugins: {x: {enabled: maybe}}\n",
		"a: &a [*a, *a]\nb: &b [*a, *a, *a]\n",
		"listen: ${FUZZ_NESTED}\n",
		"\xff\xfe",
		"---\n---\n",
		"plugins:\n  metrics:\n    enabled: true\n    sha256: zz\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data string) {
		t.Setenv("FUZZ_TOKEN", "0123456789abcdef0123")
		t.Setenv("FUZZ_NESTED", "${FUZZ_TOKEN}")
		cfg, err := ParseConfig("fuzz.yaml", []byte(data))
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) || !strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Fatalf("refused with %T %q; want a *ConfigError naming the file", err, err)
			}
			return
		}
		if cfg == nil {
			t.Fatal("no error and no config")
		}
		if strings.Contains(cfg.Listen, "0123456789abcdef0123") {
			t.Fatalf("listen %q: a reference was expanded twice", cfg.Listen)
		}
	})
}

// FuzzPluginPath: the path a plugin gets is its part of the request's path
// as the client escaped it, always starting with a slash, and never more
// than the request's own path.
func FuzzPluginPath(f *testing.F) {
	for _, seed := range []string{"/api/tasks", "/api/topics/50%25off", "", "/a%2Fb", "/../x", "/%00", "//x", "/caf%C3%A9"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, rest string) {
		if !strings.HasPrefix(rest, "/") {
			rest = "/" + rest
		}
		r, err := http.NewRequest("GET", "http://127.0.0.1/plugin-pkg/tasks_worker"+rest, nil)
		if err != nil || r.URL.Opaque != "" {
			return // not a URL a server would route here
		}
		got := pluginPath(r, "tasks_worker")
		if !strings.HasPrefix(got, "/") {
			t.Fatalf("pluginPath for %q = %q: no leading slash", rest, got)
		}
		if full := r.URL.EscapedPath(); !strings.HasSuffix(full, strings.TrimPrefix(got, "/")) {
			t.Fatalf("pluginPath for %q = %q: not a part of the escaped path %q", rest, got, full)
		}
	})
}
