package e2e

// The tasks UI in a real browser: headless Chromium, driven with chromedp,
// against a real host running the real tasks_worker binary.

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

const chromiumPath = "/usr/bin/chromium"

// uiBrowserConfig runs tasks_worker on the local (SQLite) broker, so the
// reaper's pass really runs when the reclaim button is pressed.
const uiBrowserConfig = `
listen: LISTEN
plugins_dir: PLUGINS
health_interval_seconds: 1
plugins:
  tasks_worker:
    enabled: true
    config:
      broker: local
      data_dir: DATADIR
      workers: 4
      drain_timeout_seconds: 0
`

// browser starts headless Chromium for the test; it fails, never skips,
// when there is none.
func browser(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("no browser at %s (%v): install Debian's chromium (apt-get install -y chromium); make test does this: scripts/test-setup.sh", chromiumPath, err)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromiumPath),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	// The first call starts the browser; it must not run under a timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v (install Debian's chromium (apt-get install -y chromium); make test does this: scripts/test-setup.sh)", chromiumPath, err)
	}
	return ctx
}

// step runs browser actions under a timeout.
func step(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// read runs one browser action that returns a value, under a timeout.
func read[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

func TestUIBrowser(t *testing.T) {
	h := startHost(t, strings.ReplaceAll(uiBrowserConfig, "DATADIR", t.TempDir()))
	h.waitState(t, "tasks_worker", "running", 30*time.Second)
	api := h.base + "/plugin-pkg/tasks_worker/api"
	ctx := browser(t)

	// Accept every confirm() the way an operator who means it would, and
	// keep what they said.
	var mu sync.Mutex
	var dialogs []string
	dialogEvents := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range dialogEvents {
			if err != nil {
				return
			}
			mu.Lock()
			dialogs = append(dialogs, ev.Message)
			mu.Unlock()
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	lastDialog := func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(dialogs) == 0 {
			return ""
		}
		return dialogs[len(dialogs)-1]
	}

	// The host's admin header links to the dashboard.
	step(t, ctx, "open the dashboard from /admin/",
		chromedp.Navigate(h.base+"/admin/"),
		chromedp.Click(chromedp.CSS(`header a[href="/plugin-pkg/tasks_worker/ui/"]`)),
		chromedp.WaitVisible(chromedp.CSS("#workers")),
	)
	if loc := read(t, ctx, "location", chromedp.Location()); loc != h.base+"/plugin-pkg/tasks_worker/ui/" {
		t.Errorf("the Tasks link leads to %s", loc)
	}
	if title := read(t, ctx, "title", chromedp.Title()); title != "Dashboard · tasks · taskhost" {
		t.Errorf("dashboard title %q", title)
	}
	if beat := read(t, ctx, "beat card", chromedp.Text(chromedp.CSS("#beat"))); !strings.Contains(beat, "leader") && !strings.Contains(beat, "standby") {
		t.Errorf("the beat card says %q", beat)
	}

	t.Run("run demo.echo from the form and see it complete", func(t *testing.T) {
		step(t, ctx, "submit the run form",
			chromedp.Navigate(h.base+"/plugin-pkg/tasks_worker/ui/run"),
			chromedp.WaitVisible(chromedp.CSS("#run-form")),
			chromedp.SetValue(chromedp.CSS("#task"), "demo.echo"),
			chromedp.SetValue(chromedp.CSS("#payload"), `{"hello": "browser"}`),
			chromedp.Click(chromedp.CSS("#submit")),
			chromedp.WaitVisible(chromedp.CSS("#state")),
		)
		loc := read(t, ctx, "location", chromedp.Location())
		if !strings.Contains(loc, "/plugin-pkg/tasks_worker/ui/tasks/") {
			t.Fatalf("after submit the browser is at %s, want the new task's page", loc)
		}
		if msg := read(t, ctx, "flash", chromedp.Text(chromedp.CSS("#flash-message"))); !strings.Contains(msg, "submitted (demo.echo)") {
			t.Errorf("flash %q", msg)
		}
		var state string
		waitFor(t, 60*time.Second, "the task page says done", func() bool {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := chromedp.Do(ctx, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#state"))); err != nil {
				return false
			}
			state, _ = chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#state")))
			return strings.TrimSpace(state) == "done"
		})
		if res := read(t, ctx, "result", chromedp.Text(chromedp.CSS("#result"))); !strings.Contains(res, `"hello": "browser"`) {
			t.Errorf("result %q", res)
		}
		if reports := read(t, ctx, "attempts", chromedp.Text(chromedp.CSS("#reports"))); !strings.Contains(reports, "success") {
			t.Errorf("attempts table %q", reports)
		}
	})

	t.Run("force-release a lock", func(t *testing.T) {
		resp, err := http.Post(api+"/tasks", "application/json", strings.NewReader(`{"task": "demo.sleep", "payload": {"seconds": 30, "lock": "L"}}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("submit demo.sleep: %d", resp.StatusCode)
		}
		held := func() bool {
			_, body := get(t, api+"/locks")
			var out struct {
				Locks []struct{ Name string } `json:"locks"`
			}
			_ = json.Unmarshal([]byte(body), &out)
			for _, l := range out.Locks {
				if l.Name == "L" {
					return true
				}
			}
			return false
		}
		waitFor(t, 60*time.Second, "/api/locks shows L", held)
		step(t, ctx, "press Force release and accept the confirm dialog",
			chromedp.Navigate(h.base+"/plugin-pkg/tasks_worker/ui/locks"),
			chromedp.WaitVisible(chromedp.CSS(`form[data-lock="L"] button`)),
			chromedp.Click(chromedp.CSS(`form[data-lock="L"] button`)),
			chromedp.WaitVisible(chromedp.CSS("#flash")),
		)
		if d := lastDialog(); !strings.HasPrefix(d, "Force-release lock L?") {
			t.Errorf("the confirm dialog said %q", d)
		}
		if msg := read(t, ctx, "flash", chromedp.Text(chromedp.CSS("#flash-message"))); !strings.HasPrefix(msg, "Lock L released.") {
			t.Errorf("flash %q", msg)
		}
		if held() {
			t.Errorf("/api/locks still shows L after the force release")
		}
	})

	t.Run("reclaim orphaned messages now", func(t *testing.T) {
		step(t, ctx, "press Reclaim and accept the confirm dialog",
			chromedp.Navigate(h.base+"/plugin-pkg/tasks_worker/ui/"),
			chromedp.WaitVisible(chromedp.CSS("#reclaim button")),
			chromedp.Click(chromedp.CSS("#reclaim button")),
			chromedp.WaitVisible(chromedp.CSS("#flash")),
		)
		if d := lastDialog(); !strings.HasPrefix(d, "Run one orphan-reclaim pass now?") {
			t.Errorf("the confirm dialog said %q", d)
		}
		msg := read(t, ctx, "flash", chromedp.Text(chromedp.CSS("#flash-message")))
		if msg != "Reclaim orphaned messages: reclaimed 0, dead-lettered 0, released 0 lock(s)" {
			t.Errorf("reclaim result %q", msg)
		}
		if cls := read(t, ctx, "flash class", chromedp.AttributeValue(chromedp.CSS("#flash"), "class")); cls.Value != "flash ok" {
			t.Errorf("flash class %q, want flash ok", cls.Value)
		}
	})

	t.Run("screenshot of the dashboard", func(t *testing.T) {
		step(t, ctx, "open the dashboard",
			chromedp.Navigate(h.base+"/plugin-pkg/tasks_worker/ui/"),
			chromedp.WaitVisible(chromedp.CSS("#chart-depth")),
		)
		png := read(t, ctx, "screenshot", chromedp.FullScreenshot(100))
		if len(png) < 8 || string(png[1:4]) != "PNG" {
			t.Fatalf("the screenshot is not a PNG (%d bytes)", len(png))
		}
		path := filepath.Join(t.TempDir(), "ui-dashboard.png")
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		// For a person to look at; not an assertion.
		_ = os.WriteFile("/tmp/ui-dashboard.png", png, 0o644)
		t.Logf("dashboard screenshot: %s (%d bytes), copied to /tmp/ui-dashboard.png", path, len(png))
	})
}
