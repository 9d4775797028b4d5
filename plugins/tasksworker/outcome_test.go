package tasksworker

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
)

// lostAnswers is a broker whose submits are stored and then fail as a
// database's do when their answer is lost on the way back.
type lostAnswers struct{ broker.Broker }

var errLostAnswer = fmt.Errorf("%w: postgres broker: submit: read tcp 127.0.0.1:5432: connection reset by peer", broker.ErrOutcomeUnknown)

func (b lostAnswers) Submit(ctx context.Context, req broker.SubmitRequest) (int64, error) {
	_, _ = b.Broker.Submit(ctx, req)
	return 0, errLostAnswer
}

func (b lostAnswers) SubmitBatch(ctx context.Context, reqs []broker.SubmitRequest) ([]broker.Submitted, error) {
	_, _ = b.Broker.SubmitBatch(ctx, reqs)
	return nil, errLostAnswer
}

// TestSubmitsWhoseAnswerWasLostSayTheOutcomeIsUnknown: a submit whose
// store lost the answer of its write may be stored, so it is not answered
// 503 (which tells a client to send it again): a 502 with
// X-Taskhost-Outcome: unknown, as the host says it, and a message saying
// to look it up first, for a task, a JSON batch and an NDJSON upload.
func TestSubmitsWhoseAnswerWasLostSayTheOutcomeIsUnknown(t *testing.T) {
	f := start(t, nil)
	rt := f.plugin.current()
	b := lostAnswers{memory.New()}
	f.plugin.swap(&runtime{cfg: rt.cfg, broker: b, reg: rt.reg, pool: rt.pool, svc: f.plugin.newService(rt.cfg, b, rt.reg, rt.pool, rt.reaper)})
	defer f.plugin.swap(rt)

	for _, c := range []struct{ name, path, body, want string }{
		{"a task", "/api/tasks", `{"task": "demo.echo"}`, "look it up before sending it again"},
		{"a JSON batch", "/api/tasks/batch", `[{"task": "demo.echo"}, {"task": "demo.echo"}]`, "look it up before sending it again"},
	} {
		res := f.do("POST", c.path, c.body)
		msg, _ := res.json(t)["error"].(string)
		if res.status != http.StatusBadGateway || res.header.Get(outcomeHeader) != "unknown" || !strings.Contains(msg, c.want) || !strings.Contains(msg, "outcome is unknown") {
			t.Errorf("%s: %d %v %s; want 502 with %s: unknown, saying %q", c.name, res.status, res.header, res.body, outcomeHeader, c.want)
		}
	}

	rec := serve(f.plugin, "POST", "/api/tasks/batch", "application/x-ndjson", strings.NewReader("{\"task\": \"demo.echo\"}\n{\"task\": \"demo.echo\"}\n"))
	if rec.Code != http.StatusBadGateway || rec.Header().Get(outcomeHeader) != "unknown" || !strings.Contains(rec.Body.String(), "lines 1 to 2 may have been stored, or not") {
		t.Errorf("an NDJSON upload: %d %v %s; want 502 with %s: unknown, saying lines 1 to 2 may be stored", rec.Code, rec.Header(), rec.Body, outcomeHeader)
	}
}
