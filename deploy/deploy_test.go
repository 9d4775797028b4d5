package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const (
	rulesFile     = "prometheus/fastpluggy-tasks.rules.yml"
	ruleTestsFile = "prometheus/fastpluggy-tasks.rules.test.yml"
	dashboardFile = "grafana/fastpluggy-tasks.json"

	// tasksPrefix is what the aggregator puts before every series of the
	// tasks_worker plugin.
	tasksPrefix = "fp_tasks_worker_"
)

// publicNames are the series the rules and the dashboard may select, as
// scraped from /plugin-pkg/metrics/api/prometheus. They are a public
// interface: never rename one in place (emit the old and the new name for a
// release, then drop the old one). Keep this list, the golden test of the
// tasks_worker plugin and docs/observability.md in step.
var publicNames = []string{
	// tasks_worker: broker gauges, read at scrape time.
	"fp_tasks_worker_fastpluggy_broker_topics",
	"fp_tasks_worker_fastpluggy_broker_workers",
	"fp_tasks_worker_fastpluggy_broker_locks",
	"fp_tasks_worker_fastpluggy_broker_topic_queued",
	"fp_tasks_worker_fastpluggy_broker_topic_running",
	"fp_tasks_worker_fastpluggy_broker_topic_dead_letter",
	"fp_tasks_worker_fastpluggy_broker_topic_subscribers",
	"fp_tasks_worker_fastpluggy_broker_topic_paused",
	"fp_tasks_worker_fastpluggy_broker_messages_queued_total",
	"fp_tasks_worker_fastpluggy_broker_messages_running_total",
	"fp_tasks_worker_fastpluggy_broker_beats",
	"fp_tasks_worker_fastpluggy_broker_oldest_running_claim_seconds",
	// tasks_worker: the rabbitmq broker's reconcile of its topic queues
	// (0 on the other brokers).
	"fp_tasks_worker_fastpluggy_broker_messages_missing",
	"fp_tasks_worker_fastpluggy_broker_messages_republished_total",
	// tasks_worker: reaper counters.
	"fp_tasks_worker_fastpluggy_broker_orphans_reclaimed_total",
	"fp_tasks_worker_fastpluggy_broker_orphans_dead_lettered_total",
	"fp_tasks_worker_fastpluggy_broker_orphan_reclaim_skipped_total",
	// tasks_worker: schedule gauges.
	"fp_tasks_worker_fastpluggy_schedule_overdue_seconds",
	"fp_tasks_worker_fastpluggy_scheduled_task_since_success_seconds",
	"fp_tasks_worker_fastpluggy_scheduled_task_interval_seconds",
	"fp_tasks_worker_fastpluggy_schedules_waiting",
	// tasks_worker: task telemetry.
	"fp_tasks_worker_fastpluggy_tasks_submitted_total",
	"fp_tasks_worker_fastpluggy_tasks_completed_total",
	"fp_tasks_worker_fastpluggy_tasks_failed_total",
	"fp_tasks_worker_fastpluggy_tasks_submitted_per_topic_total",
	"fp_tasks_worker_fastpluggy_tasks_completed_per_topic_total",
	"fp_tasks_worker_fastpluggy_tasks_failed_per_topic_total",
	"fp_tasks_worker_fastpluggy_tasks_cancelled_total",
	"fp_tasks_worker_fastpluggy_tasks_cancelled_per_topic_total",
	"fp_tasks_worker_fastpluggy_tasks_running",
	"fp_tasks_worker_fastpluggy_tasks_duration_seconds",
	"fp_tasks_worker_fastpluggy_tasks_reports_dropped_total",
	"fp_tasks_worker_fastpluggy_tasks_strays_requeued_total",
	"fp_tasks_worker_fastpluggy_tasks_heartbeat_age_seconds",
	"fp_tasks_worker_fastpluggy_tasks_overrunning",
	// The aggregator's own series, prefixed fp_metrics_ already.
	"fp_metrics_source_up",
	"fp_metrics_source_scrape_duration_seconds",
	"fp_metrics_source_errors_total",
}

// histograms are the public names that are histograms: they are selected
// by their _bucket, _sum and _count series.
var histograms = []string{"fp_tasks_worker_fastpluggy_tasks_duration_seconds"}

// announced are public names another change adds to the Go code. Until it
// lands, TestPublicNamesAreEmitted only notes that they are not emitted
// yet; once they are, it checks them like every other name.
var announced = []string{
	"fp_tasks_worker_fastpluggy_schedule_overdue_seconds",
	"fp_tasks_worker_fastpluggy_scheduled_task_since_success_seconds",
	"fp_tasks_worker_fastpluggy_scheduled_task_interval_seconds",
}

// selectable are the series names a PromQL expression may use.
func selectable() map[string]bool {
	names := map[string]bool{}
	for _, n := range publicNames {
		names[n] = true
	}
	for _, h := range histograms {
		delete(names, h)
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			names[h+s] = true
		}
	}
	return names
}

// familyOf maps a histogram's _bucket, _sum and _count series to the
// histogram's name; other names are their own family.
func familyOf(name string) string {
	for _, h := range histograms {
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			if name == h+s {
				return h
			}
		}
	}
	return name
}

var (
	// quoted matches PromQL string literals, whose content (label values,
	// template text) is not a series name.
	quoted = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	// identifier matches PromQL identifiers: series names, label names,
	// functions, keywords.
	identifier = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	// prefixed matches anything that looks like a scraped series name.
	prefixed = regexp.MustCompile(`fp_[a-zA-Z0-9_:]+`)
)

// seriesIn returns the identifiers of expr that look like one of our series
// names: the fp_ prefix, the fastpluggy_ stem without the prefix, or the
// Go and process collectors' families.
func seriesIn(expr string) []string {
	var out []string
	for _, id := range identifier.FindAllString(quoted.ReplaceAllString(expr, `""`), -1) {
		if strings.HasPrefix(id, "fp_") || strings.Contains(id, "fastpluggy_") ||
			strings.HasPrefix(id, "go_") || strings.HasPrefix(id, "process_") {
			out = append(out, id)
		}
	}
	return out
}

// checkExpr fails the test when expr selects no public series or names
// one that is not public, and returns the public names it uses.
func checkExpr(t *testing.T, where, expr string) []string {
	t.Helper()
	allowed := selectable()
	names := seriesIn(expr)
	if len(names) == 0 {
		t.Errorf("%s: %q selects none of the public series", where, expr)
	}
	for _, n := range names {
		if !allowed[n] {
			t.Errorf("%s: %q selects %s, which is not a public series name (scraped names carry the fp_<plugin>_ prefix; see publicNames)", where, expr, n)
		}
	}
	return names
}

// promtool runs promtool with args and fails the test with its output when
// it does not succeed. A missing promtool is a failure, never a skip: the
// rules are exactly what silently stops working when nobody tests them.
func promtool(t *testing.T, args ...string) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not installed (%v): install Debian's prometheus package (apt-get install -y prometheus); make test does this: scripts/test-setup.sh", err)
	}
	out, err := exec.CommandContext(t.Context(), path, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// ruleCount is how many alert rules the rules file holds: the five the
// specification names, FastpluggyTaskReportsDropped,
// FastpluggyTopicUnserved, FastpluggyWorkerHeartbeatFailing,
// FastpluggyTopicPausedWithQueue, FastpluggyScheduleWaitingForWorker,
// FastpluggyQueuedTasksRepublished and FastpluggyQueuedTasksMissing (the
// rabbitmq broker's topic queues), and the two informational ones of the
// orphan-recovery specification's watch list, FastpluggyOrphansReclaimed
// and FastpluggyOrphansDeadLettered.
const ruleCount = 14

func TestAlertRules(t *testing.T) {
	out := promtool(t, "check", "rules", rulesFile)
	if !strings.Contains(out, fmt.Sprintf("SUCCESS: %d rules found", ruleCount)) {
		t.Errorf("promtool check rules: want %d rules\n%s", ruleCount, out)
	}
	promtool(t, "test", "rules", ruleTestsFile)
}

// ruleExprs returns the expr of every rule in a rules file: the rest of
// the line, or the block scalar below it.
func ruleExprs(text string) []string {
	exprLine := regexp.MustCompile(`^(\s*(?:- )?)expr:\s*(.*)$`)
	lines := strings.Split(text, "\n")
	var exprs []string
	for i := 0; i < len(lines); i++ {
		m := exprLine.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		rest := strings.TrimSpace(m[2])
		if !strings.HasPrefix(rest, "|") && !strings.HasPrefix(rest, ">") {
			exprs = append(exprs, strings.Trim(rest, `'"`))
			continue
		}
		indent := len(m[1])
		var block []string
		for i+1 < len(lines) {
			next := lines[i+1]
			if strings.TrimSpace(next) != "" && len(next)-len(strings.TrimLeft(next, " ")) <= indent {
				break
			}
			block = append(block, strings.TrimSpace(next))
			i++
		}
		exprs = append(exprs, strings.TrimSpace(strings.Join(block, "\n")))
	}
	return exprs
}

// TestRuleSeriesArePublic checks the names the rules select, and every fp_
// name their text and their unit tests mention: a "must not fire" test
// over a misspelled series would pass without testing anything.
func TestRuleSeriesArePublic(t *testing.T) {
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	exprs := ruleExprs(string(rules))
	if len(exprs) != ruleCount {
		t.Fatalf("found %d rule expressions in %s, want %d: %q", len(exprs), rulesFile, ruleCount, exprs)
	}
	for _, e := range exprs {
		checkExpr(t, rulesFile, e)
	}
	for _, alert := range []string{"FastpluggyBeatDead", "FastpluggyScheduleOverdue", "FastpluggyTopicWedged",
		"FastpluggyOrphanReclaimFailClosed", "FastpluggyScheduleNotProducing",
		"FastpluggyOrphansReclaimed", "FastpluggyOrphansDeadLettered"} {
		if !strings.Contains(string(rules), "- alert: "+alert+"\n") {
			t.Errorf("%s has no rule %s", rulesFile, alert)
		}
	}

	tests, err := os.ReadFile(ruleTestsFile)
	if err != nil {
		t.Fatal(err)
	}
	allowed := selectable()
	for file, text := range map[string]string{rulesFile: string(rules), ruleTestsFile: string(tests)} {
		for _, n := range prefixed.FindAllString(text, -1) {
			// A bare prefix ("fp_tasks_worker_") is prose, not a name.
			if !strings.HasSuffix(n, "_") && !allowed[n] {
				t.Errorf("%s mentions %s, which is not a public series name", file, n)
			}
		}
	}
}

func TestDashboardJSON(t *testing.T) {
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s is not JSON: %v", dashboardFile, err)
	}
	if v, _ := dash["schemaVersion"].(float64); v < 36 {
		t.Errorf("schemaVersion = %v, want 36 or later", dash["schemaVersion"])
	}
	if s, _ := dash["uid"].(string); s == "" {
		t.Error("the dashboard has no uid")
	}
	inputs, _ := dash["__inputs"].([]any)
	if !slices.ContainsFunc(inputs, func(in any) bool {
		m, _ := in.(map[string]any)
		return m["name"] == "DS_PROMETHEUS" && m["pluginId"] == "prometheus"
	}) {
		t.Error("__inputs has no DS_PROMETHEUS prometheus data source")
	}

	var exprs []string
	ids := map[float64]bool{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if ds, ok := v["datasource"].(map[string]any); ok && ds["type"] == "prometheus" && ds["uid"] != "${DS_PROMETHEUS}" {
				t.Errorf("%s: data source uid %v, want ${DS_PROMETHEUS}", path, ds["uid"])
			}
			if _, isPanel := v["gridPos"]; isPanel {
				id, _ := v["id"].(float64)
				if id == 0 || ids[id] {
					t.Errorf("%s: panel %q has id %v: want a unique, non-zero id", path, v["title"], v["id"])
				}
				ids[id] = true
			}
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || k == "definition") {
					exprs = append(exprs, s)
					continue
				}
				walk(path+"."+k, x)
			}
		case []any:
			for _, x := range v {
				walk(path+"[]", x)
			}
		case string:
			if strings.HasSuffix(path, ".query.query") {
				exprs = append(exprs, v)
			}
		}
	}
	walk("", dash)
	if len(exprs) == 0 {
		t.Fatal("the dashboard has no expressions")
	}

	used := map[string]bool{}
	for _, e := range exprs {
		for _, n := range checkExpr(t, dashboardFile, e) {
			used[familyOf(n)] = true
		}
	}
	// The dashboard shows the whole surface: a new public name needs a
	// panel.
	for _, n := range publicNames {
		if !used[n] {
			t.Errorf("no panel of the dashboard uses %s", n)
		}
	}
}

// TestPublicNamesAreEmitted ties publicNames to the Go code: each name
// must appear, without the aggregator's prefix for tasks_worker's, as a
// string literal in a non-test Go file of the module. Renaming a metric in
// the code then fails here as well as in the plugin's golden test.
func TestPublicNamesAreEmitted(t *testing.T) {
	var src strings.Builder
	// Other changes may add or remove files while this runs: a file that
	// vanished is skipped, any other error fails the test.
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != ".." && (strings.HasPrefix(name, ".") || name == "deploy" || name == "testdata" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		src.Write(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	code := src.String()
	for _, n := range publicNames {
		literal := `"` + strings.TrimPrefix(n, tasksPrefix) + `"`
		if strings.Contains(code, literal) {
			continue
		}
		if slices.Contains(announced, n) {
			t.Logf("%s is not emitted yet (announced by another change)", n)
			continue
		}
		t.Errorf("no Go file emits %s (looked for the literal %s): was it renamed? Emit the old and the new name for a release, then drop the old one", n, literal)
	}
}
