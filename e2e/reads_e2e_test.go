package e2e

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

// Wrong tokens lock an address out (429 even for the right token), and
// the metrics plugin's scrape counts them in the host's own series.
func TestLockoutIsCountedInTheScrape(t *testing.T) {
	h := startHost(t, "listen: LISTEN\nplugins_dir: PLUGINS\nadmin_token: "+readsToken+
		"\nauth_max_failures: 3\nplugins:\n  metrics:\n    enabled: true\n  echo:\n    enabled: true\n")
	post := func(token string) *http.Response {
		req, _ := http.NewRequest("POST", h.base+"/plugin-pkg/echo/echo", strings.NewReader("x"))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for i := 0; i < 3; i++ {
		if resp := post("wrong-token-0123456789"); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d", i, resp.StatusCode)
		}
	}
	if resp := post(readsToken); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("the right token after 3 wrong ones: %d Retry-After %q; want 429", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	var body string
	waitFor(t, 60*time.Second, "the scrape has the host's series", func() bool {
		var code int
		code, body = get(t, h.base+"/plugin-pkg/metrics/api/prometheus")
		return code == 200 && hasSeries(body, "fp_host_http_auth_failures_total")
	})
	for _, want := range []string{"fp_host_http_auth_failures_total 3", "fp_host_http_auth_lockouts_total 1",
		"fp_host_http_auth_locked_out_refusals_total 1", `fp_metrics_source_up{plugin="host"} 1`} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("scrape lacks %q:\n%s", want, grepLines(body, want[:20]))
		}
	}
	if !hasSeries(body, "fp_host_http_connections_open") || !hasSeries(body, "fp_host_http_connections_evicted_total") {
		t.Errorf("scrape lacks the connection series")
	}
	promtoolCheck(t, body)
}

func grepLines(body, sub string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
