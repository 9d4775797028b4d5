package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// submitAnswer is what a client was told about one submit.
type submitAnswer struct {
	marker     string
	status     int // 0: no HTTP answer (the connection failed)
	body       string
	outcome    string // the X-Taskhost-Outcome header
	retryAfter string
}

// TestSubmitsWhileThePluginDiesAreNeverMisreported submits from 8
// goroutines while tasks_worker is SIGKILLed round after round. Whatever
// the moment of the kill, a client is never told success for a task that
// was not stored, nor told to retry (503 with Retry-After) a task that was
// stored: a request that reached the plugin before it died gets a 502
// saying its outcome is unknown.
func TestSubmitsWhileThePluginDiesAreNeverMisreported(t *testing.T) {
	schema := pgSchema(t)
	h := startHost(t, twConfig(schema, twOpts{}))
	st, _ := h.waitWorker(t, 0)

	client := &http.Client{Timeout: 60 * time.Second}
	var (
		mu      sync.Mutex
		answers []submitAnswer
		oks     int
	)
	submit := func(marker string) submitAnswer {
		a := submitAnswer{marker: marker}
		b, _ := json.Marshal(map[string]any{"task": "demo.echo", "payload": map[string]string{"m": marker}})
		req, err := http.NewRequest("POST", h.api("/tasks"), bytes.NewReader(b))
		if err != nil {
			t.Error(err)
			return a
		}
		req.Header.Set("Authorization", "Bearer "+reaperToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			a.body = err.Error()
			return a
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		a.status, a.body = resp.StatusCode, string(raw)
		a.outcome, a.retryAfter = resp.Header.Get("X-Taskhost-Outcome"), resp.Header.Get("Retry-After")
		return a
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				a := submit(fmt.Sprintf("g%d-%d", g, i))
				mu.Lock()
				answers = append(answers, a)
				if a.status == http.StatusCreated {
					oks++
				}
				mu.Unlock()
				if a.status != http.StatusCreated {
					// Restarting: don't spin on the host.
					select {
					case <-stop:
						return
					case <-time.After(50 * time.Millisecond):
					}
				}
			}
		})
	}
	stopped := false
	stopSubmitters := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopSubmitters()

	const rounds = 6
	for round := range rounds {
		mu.Lock()
		base := oks
		mu.Unlock()
		// Kill while submits are flowing: after some were stored since
		// the last restart.
		waitFor(t, 2*time.Minute, fmt.Sprintf("round %d: submits are accepted again", round), func() bool {
			mu.Lock()
			defer mu.Unlock()
			return oks >= base+20
		})

		kill(t, st.PID, syscall.SIGKILL)
		st, _ = h.waitWorker(t, st.PID)
	}
	stopSubmitters()

	// What was stored, by marker.
	c := pgConn(t, schema)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := c.Query(ctx, `SELECT id, payload->>'m' FROM tw_messages_all WHERE task = 'demo.echo'`)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string][]int64{}
	for rows.Next() {
		var id int64
		var m string
		if err := rows.Scan(&id, &m); err != nil {
			t.Fatal(err)
		}
		stored[m] = append(stored[m], id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	counts := map[string]int{}
	for _, a := range answers {
		ids := stored[a.marker]
		if len(ids) > 1 {
			t.Errorf("submit %s was stored %d times: %v", a.marker, len(ids), ids)
		}
		switch {
		case a.status == http.StatusCreated:
			counts["201"]++
			var created struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal([]byte(a.body), &created); err != nil || created.ID == "" {
				t.Errorf("submit %s: 201 without an id: %q", a.marker, a.body)
				continue
			}
			if len(ids) != 1 || fmt.Sprint(ids[0]) != created.ID {
				t.Errorf("submit %s: 201 with id %s, but stored as %v", a.marker, created.ID, ids)
			}
		case a.status == http.StatusServiceUnavailable:
			counts["503"]++
			if len(ids) != 0 {
				t.Errorf("submit %s: told 503 (retry after %q: %s) but it was stored as %v", a.marker, a.retryAfter, a.body, ids)
			}
		case a.status == http.StatusBadGateway || a.status == http.StatusGatewayTimeout:
			counts[fmt.Sprint(a.status)]++
			if a.outcome != "unknown" || a.retryAfter != "" || !strings.Contains(a.body, "unknown") {
				t.Errorf("submit %s: %d without saying the outcome is unknown (header %q, Retry-After %q): %s",
					a.marker, a.status, a.outcome, a.retryAfter, a.body)
			}
			if len(ids) == 1 {
				counts["unknown, stored"]++
			}
		case a.status == 0:
			counts["no answer"]++
		default:
			counts[fmt.Sprint(a.status)]++
			t.Errorf("submit %s: unexpected %d: %s", a.marker, a.status, a.body)
		}
	}
	t.Logf("%d submits over %d kills: %v", len(answers), rounds, counts)
}
