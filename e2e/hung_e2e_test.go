package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

type healthz struct {
	Status  string            `json:"status"`
	Plugins map[string]string `json:"plugins"`
}

func (h *hostProc) healthz(t *testing.T) healthz {
	t.Helper()
	code, body := get(t, h.base+"/healthz")
	var hz healthz
	if err := json.Unmarshal([]byte(body), &hz); err != nil || code != http.StatusOK {
		t.Fatalf("/healthz: %d %s", code, body)
	}
	return hz
}

// pluginHealth returns a plugin's health text from the admin API.
func (h *hostProc) pluginHealth(t *testing.T, name string) string {
	t.Helper()
	_, body := get(t, h.base+"/admin/api/plugins")
	var resp struct {
		Plugins []struct {
			Name   string `json:"name"`
			Health string `json:"health"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatal(err)
	}
	for _, p := range resp.Plugins {
		if p.Name == name {
			return p.Health
		}
	}
	return ""
}

// TestHealthFrozenPluginIsDegradedUntilItAnswers: a plugin stopped with
// SIGSTOP does not answer its health check: it is degraded, saying so,
// and /healthz with it; continued, it is running again, the same process.
func TestHealthFrozenPluginIsDegradedUntilItAnswers(t *testing.T) {
	h := startHost(t, `
listen: LISTEN
plugins_dir: PLUGINS
health_interval_seconds: 1
hung_restart_seconds: 3600
plugins:
  echo:
    enabled: true
`)
	before := h.waitState(t, "echo", "running", 30*time.Second)
	waitFor(t, 30*time.Second, "/healthz says ok", func() bool { return h.healthz(t).Status == "ok" })
	if err := syscall.Kill(before.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(before.PID, syscall.SIGCONT) })
	waitFor(t, 60*time.Second, "/healthz says the frozen echo is degraded", func() bool {
		hz := h.healthz(t)
		return hz.Status == "degraded" && hz.Plugins["echo"] == "degraded"
	})
	if health := h.pluginHealth(t, "echo"); !strings.Contains(health, "not answering its health check for") {
		t.Errorf("frozen echo's health %q; want it to say it is not answering its health check", health)
	}
	_, page := get(t, h.base+"/admin/")
	if !strings.Contains(page, "not answering its health check for") {
		t.Error("/admin/ does not say why echo is degraded")
	}
	waitFor(t, 60*time.Second, "the host log says echo does not answer", func() bool {
		return strings.Contains(h.log.String(), "not answering its health check for")
	})
	if err := syscall.Kill(before.PID, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "echo is running and /healthz ok again", func() bool {
		hz := h.healthz(t)
		return hz.Status == "ok" && hz.Plugins["echo"] == "running"
	})
	if after := h.plugins(t)["echo"]; after.PID != before.PID || after.Restarts != before.Restarts {
		t.Errorf("echo after it was continued: pid %d, restarts %d; want the same process (pid %d) not restarted", after.PID, after.Restarts, before.PID)
	}
	if health := h.pluginHealth(t, "echo"); health != "ok" {
		t.Errorf("echo's health after it answers again: %q, want ok", health)
	}
}

// TestHealthPluginFrozenTooLongIsRestarted: a plugin that does not answer
// its health check for hung_restart_seconds is killed and started again.
func TestHealthPluginFrozenTooLongIsRestarted(t *testing.T) {
	h := startHost(t, `
listen: LISTEN
plugins_dir: PLUGINS
health_interval_seconds: 1
hung_restart_seconds: 8
plugins:
  echo:
    enabled: true
`)
	before := h.waitState(t, "echo", "running", 30*time.Second)
	if err := syscall.Kill(before.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(before.PID, syscall.SIGCONT) })
	start := time.Now()
	waitFor(t, 60*time.Second, "echo is degraded", func() bool { return h.plugins(t)["echo"].State == "degraded" })
	waitFor(t, 90*time.Second, "the frozen echo is replaced by a new process", func() bool {
		st := h.plugins(t)["echo"]
		return st.State == "running" && st.PID != 0 && st.PID != before.PID
	})
	if took := time.Since(start); took < 8*time.Second {
		t.Errorf("echo was restarted %s after it froze, before hung_restart_seconds (8 s)", took)
	}
	after := h.plugins(t)["echo"]
	if after.Restarts <= before.Restarts || !strings.Contains(after.LastError, "not answering its health check for") {
		t.Errorf("echo after the freeze: restarts %d (was %d), last error %q; want a restart saying it did not answer", after.Restarts, before.Restarts, after.LastError)
	}
	waitFor(t, 60*time.Second, "the frozen process is gone", func() bool { return !pidAlive(before.PID) })
}
