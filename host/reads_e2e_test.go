package host_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

const readsToken = "reads-token-0123456789"

func getWith(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A failed plugin's last error (it may name a DSN's user, host and
// database) is for the admin: the proxy's 503 gives it only to a client
// with the token, and /healthz gives states only. Both modes of
// public_reads.
func TestProxyErrorsHideTheLastError(t *testing.T) {
	for _, public := range []bool{true, false} {
		name := map[bool]string{true: "public reads", false: "private reads"}[public]
		t.Run(name, func(t *testing.T) {
			cfg := "listen: LISTEN\nplugins_dir: PLUGINS\nadmin_token: " + readsToken + "\nrestart_budget: 1\n"
			if !public {
				cfg += "public_reads: false\n"
			}
			cfg += "plugins:\n  crasher:\n    enabled: true\n  echo:\n    enabled: true\n"
			h := startHost(t, cfg)
			var lastError string
			waitFor(t, 60*time.Second, "crasher is failed", func() bool {
				code, body := getWith(t, h.base+"/admin/api/plugins", readsToken)
				if code != 200 {
					return false
				}
				var out struct {
					Plugins []pluginStatus `json:"plugins"`
				}
				if json.Unmarshal([]byte(body), &out) != nil {
					return false
				}
				for _, p := range out.Plugins {
					if p.Name == "crasher" && p.State == "failed" {
						lastError = p.LastError
						return true
					}
				}
				return false
			})
			if !strings.Contains(lastError, "crasher: failing on purpose at start") {
				t.Fatalf("last error %q; want the plugin's stderr in it", lastError)
			}
			code, body := getWith(t, h.base+"/plugin-pkg/crasher/x", "")
			want := http.StatusServiceUnavailable
			if !public {
				want = http.StatusUnauthorized
			}
			if code != want || strings.Contains(body, "failing on purpose") || strings.Contains(body, "handshake") {
				t.Errorf("proxy to the failed plugin without the token: %d %s; want %d without its last error", code, body, want)
			}
			code, body = getWith(t, h.base+"/plugin-pkg/crasher/x", readsToken)
			if code != http.StatusServiceUnavailable || !strings.Contains(body, "failing on purpose") {
				t.Errorf("proxy to the failed plugin with the token: %d %s; want 503 with its last error", code, body)
			}
			code, body = getWith(t, h.base+"/healthz", "")
			if code != 200 || strings.Contains(body, "failing on purpose") || !strings.Contains(body, `"crasher": "failed"`) {
				t.Errorf("/healthz: %d %s; want the states without errors", code, body)
			}
			waitFor(t, 30*time.Second, "echo answers the admin", func() bool {
				code, _ := getWith(t, h.base+"/plugin-pkg/echo/echo", readsToken)
				return code == 200
			})
			code, _ = getWith(t, h.base+"/plugin-pkg/echo/echo", "")
			if public && code != 200 || !public && code != http.StatusUnauthorized {
				t.Errorf("GET of echo without the token: %d (public_reads %v)", code, public)
			}
		})
	}
}
