package e2e

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

var updateGolden = flag.Bool("update", false, "rewrite e2e/testdata/metrics.golden from the scrape")

// TestMetricSurfaceIsGolden scrapes the aggregated endpoint through a real
// host and compares every tasks_worker, aggregator and host series name and type
// with testdata/metrics.golden. The names are a public interface (alert
// rules select them): renaming, dropping or retyping one fails here. To add
// a series, add it to the golden file; to retire one, emit old and new for a
// release first (see docs/observability.md).
func TestMetricSurfaceIsGolden(t *testing.T) {
	h := startHost(t, goldenConfig)
	h.waitState(t, "tasks_worker", "running", 30*time.Second)
	h.waitState(t, "metrics", "running", 30*time.Second)
	surface := produceConditionalSeries(t, h)
	_, body := get(t, h.base+"/plugin-pkg/metrics/api/prometheus")
	promtoolCheck(t, body)
	golden := filepath.Join("testdata", "metrics.golden")
	got := strings.Join(surface, "\n") + "\n"
	if *updateGolden {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("read %s (create it with go test ./e2e -run TestMetricSurfaceIsGolden -update): %v", golden, err)
	}
	wantSet := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(string(want)), "\n") {
		wantSet[l] = true
	}
	gotSet := map[string]bool{}
	for _, l := range surface {
		gotSet[l] = true
	}
	for l := range wantSet {
		if !gotSet[l] {
			t.Errorf("series gone or retyped: %q is in the golden file but not in the scrape", l)
		}
	}
	for l := range gotSet {
		if !wantSet[l] {
			t.Errorf("new series %q: add it to %s (and to docs/observability.md)", l, golden)
		}
	}
}

// goldenConfig runs tasks_worker with a schedule, and a plugin that is
// down, so that every conditional series can appear.
const goldenConfig = `
listen: LISTEN
plugins_dir: PLUGINS
plugins:
  tasks_worker:
    enabled: true
    config:
      broker: memory
      workers: 2
      beat_tick_seconds: 0.2
      schedules:
        - {name: golden, task: demo.echo, interval_seconds: 1}
  metrics:
    enabled: true
  ghost:
    enabled: true   # no binary: a source that is down, for fp_metrics_source_errors_total
`

// produceConditionalSeries makes the series that exist only in some states
// appear (a claim in flight, a failure, a schedule's first success, a
// source that is down) and returns the scrape's surface once they are all
// there.
func produceConditionalSeries(t *testing.T, h *hostProc) []string {
	t.Helper()
	for _, body := range []string{`{"task": "demo.sleep", "payload": {"seconds": 120}}`, `{"task": "demo.fail"}`} {
		resp, err := http.Post(h.base+"/plugin-pkg/tasks_worker/api/tasks", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("submit %s: %d", body, resp.StatusCode)
		}
	}
	var surface []string
	waitFor(t, 90*time.Second, "every conditional series is present", func() bool {
		code, body := get(t, h.base+"/plugin-pkg/metrics/api/prometheus")
		if code != http.StatusOK {
			return false // the metrics plugin is still starting (503)
		}
		surface = metricSurface(t, body)
		joined := strings.Join(surface, "\n")
		return strings.Contains(joined, "fp_tasks_worker_fastpluggy_broker_oldest_running_claim_seconds ") &&
			strings.Contains(joined, "fp_tasks_worker_fastpluggy_scheduled_task_since_success_seconds ") &&
			strings.Contains(joined, "fp_tasks_worker_fastpluggy_tasks_failed_per_topic_total ") &&
			strings.Contains(joined, "fp_metrics_source_errors_total ")
	})
	return surface
}

// metricSurface lists "name type" for every tasks_worker, aggregator and
// host family of the scrape, except the Go runtime and process collectors,
// whose set varies with the Go version.
func metricSurface(t *testing.T, body string) []string {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatalf("scrape does not parse: %v", err)
	}
	var out []string
	for name, mf := range fams {
		if strings.HasPrefix(name, "fp_tasks_worker_go_") || strings.HasPrefix(name, "fp_tasks_worker_process_") {
			continue
		}
		if !strings.HasPrefix(name, "fp_tasks_worker_") && !strings.HasPrefix(name, "fp_metrics_") && !strings.HasPrefix(name, "fp_host_") {
			continue
		}
		out = append(out, fmt.Sprintf("%s %s", name, strings.ToLower(mf.GetType().String())))
	}
	sort.Strings(out)
	return out
}

// TestRealPrometheusScrapesEverySeries runs Debian's Prometheus against a
// running host and checks, through Prometheus's own API, that every series
// of the golden surface arrives with its prefix and that the target is up.
func TestRealPrometheusScrapesEverySeries(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not found: install Debian's prometheus package (apt-get install -y prometheus); make test does this: scripts/test-setup.sh")
	}
	h := startHost(t, goldenConfig)
	h.waitState(t, "tasks_worker", "running", 30*time.Second)
	h.waitState(t, "metrics", "running", 30*time.Second)
	produceConditionalSeries(t, h)
	dir := t.TempDir()
	promAddr := freeAddr(t)
	cfg := fmt.Sprintf(`global: {scrape_interval: 3s, scrape_timeout: 3s}
scrape_configs:
  - job_name: taskhost
    metrics_path: /plugin-pkg/metrics/api/prometheus
    static_configs: [{targets: [%q]}]
`, strings.TrimPrefix(h.base, "http://"))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+promAddr)
	var log syncBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", log.String())
		}
	})
	want, err := os.ReadFile(filepath.Join("testdata", "metrics.golden"))
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	// A scrape may time out on a loaded machine (then up is 0 until the
	// next one): wait for a scrape that is up, not only for the names.
	waitFor(t, 120*time.Second, "Prometheus has every golden series, and its last scrape is up", func() bool {
		resp, err := http.Get("http://" + promAddr + "/api/v1/label/__name__/values")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var names struct {
			Data []string `json:"data"`
		}
		if json.NewDecoder(resp.Body).Decode(&names) != nil {
			return false
		}
		have := map[string]bool{}
		for _, n := range names.Data {
			have[n] = true
		}
		missing = missing[:0]
		for _, line := range strings.Split(strings.TrimSpace(string(want)), "\n") {
			name := strings.Fields(line)[0]
			if strings.HasSuffix(line, " histogram") {
				name += "_bucket"
			}
			if !have[name] {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 || !have["up"] {
			return false
		}
		_, up := get(t, "http://"+promAddr+"/api/v1/query?query=up")
		return strings.Contains(up, `"value":[`) && strings.Contains(up, `,"1"]`)
	})
}
