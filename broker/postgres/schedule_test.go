package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/brokertest"
	"github.com/taskhost/taskhost/internal/testdb"
)

func TestSchedules(t *testing.T) {
	brokertest.RunSchedules(t, func(t *testing.T) broker.Broker { return newTestBroker(t, Options{}) })
}

// twoBrokers returns two brokers on one fresh schema, each with a
// connection pool of its own, as two processes would have.
func twoBrokers(t *testing.T) (*Broker, *Broker) {
	t.Helper()
	b1 := newTestBroker(t, Options{MaxConns: 4})
	b2, err := New(t.Context(), Options{DSN: testdb.DSN(), Schema: b1.Schema(), MaxConns: 4})
	if err != nil {
		t.Fatalf("New (second broker): %v", err)
	}
	t.Cleanup(func() { _ = b2.Close() })
	return b1, b2
}

// TestFireScheduleAcrossBrokers fires the same slots from two brokers (two
// connection pools, as two processes would) at once: each slot fires
// exactly once and submits exactly one message.
func TestFireScheduleAcrossBrokers(t *testing.T) {
	ctx := t.Context()
	b1, b2 := twoBrokers(t)

	if _, err := b1.PutSchedule(ctx, broker.Schedule{Name: "s", Task: "t.s", Topic: "race", IntervalSeconds: 1, Enabled: true}); err != nil {
		t.Fatal(err)
	}
	// Both take part in the election; the fires are fenced by b1's lease
	// on one side and unfenced on the other, as an old leader's last fire
	// racing a new one's would be at worst.
	l, held, err := b1.TryLease(ctx, "beat", "p1", time.Minute)
	if err != nil || !held {
		t.Fatalf("TryLease = %+v, %v, %v", l, held, err)
	}
	fence := &broker.Fence{Name: "beat", Holder: "p1", Term: l.Term}

	base := time.Now().UTC().Truncate(time.Second)
	const slots, perBroker = 10, 4
	for i := range slots {
		slot := base.Add(time.Duration(i) * time.Second)
		req := broker.FireRequest{Name: "s", Slot: slot, Next: slot.Add(time.Second),
			Submit: &broker.SubmitRequest{Topic: "race", Task: "t.s"}}
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			fired []int64
		)
		start := make(chan struct{})
		for j := range 2 * perBroker {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b, r := b1, req
				if j%2 == 1 {
					b = b2
				} else {
					r.Fence = fence
				}
				<-start
				res, err := b.FireSchedule(context.Background(), r)
				if err != nil {
					t.Errorf("slot %d, fire %d: %v", i, j, err)
					return
				}
				if res.Fired {
					mu.Lock()
					fired = append(fired, res.MessageID)
					mu.Unlock()
				}
			}()
		}
		close(start)
		wg.Wait()
		if len(fired) != 1 || fired[0] <= 0 {
			t.Fatalf("slot %d fired %d times across two brokers (messages %v), want once", i, len(fired), fired)
		}
	}
	msgs, err := b2.ListMessages(ctx, broker.MessageFilter{Topic: "race", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != slots {
		t.Fatalf("%d messages submitted for %d slots", len(msgs), slots)
	}
	s, err := b2.GetSchedule(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if want := base.Add(slots * time.Second); s.ExpectedNextRun == nil || !s.ExpectedNextRun.Equal(want) {
		t.Fatalf("ExpectedNextRun = %v, want %v", s.ExpectedNextRun, want)
	}
}

// TestAddReportsConcurrently stores success reports of the same schedules
// from two brokers at once, each batch naming them in a different order:
// no batch fails, every report is stored and every schedule ends with the
// latest end reported.
func TestAddReportsConcurrently(t *testing.T) {
	ctx := t.Context()
	b1, b2 := twoBrokers(t)
	names := []string{"a", "b", "c", "d"}
	for _, n := range names {
		if _, err := b1.PutSchedule(ctx, broker.Schedule{Name: n, Task: "t", Topic: "q", IntervalSeconds: 60, Enabled: true}); err != nil {
			t.Fatal(err)
		}
	}
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	const writers, batches = 6, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers*batches)
	for w := range writers {
		b := b1
		if w%2 == 1 {
			b = b2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range batches {
				var rs []broker.Report
				for k := range names {
					n := names[k]
					if (w+i)%2 == 1 {
						n = names[len(names)-1-k]
					}
					end := base.Add(time.Duration(w*batches+i) * time.Second)
					rs = append(rs, broker.Report{MessageID: int64(w*1000 + i), Task: "t", Topic: "q", Schedule: n,
						Attempt: 1, Worker: "w", Status: broker.ReportSuccess, StartedAt: end, EndedAt: end})
				}
				if _, err := b.AddReports(ctx, rs); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("AddReports: %v", err)
	}
	want := base.Add(time.Duration(writers*batches-1) * time.Second)
	for _, n := range names {
		s, err := b1.GetSchedule(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if s.LastSuccess == nil || !s.LastSuccess.Equal(want) {
			t.Errorf("schedule %s LastSuccess = %v, want %s", n, s.LastSuccess, want)
		}
	}
	got, err := b1.ListReports(ctx, broker.ReportFilter{Limit: broker.MaxReportLimit})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != writers*batches*len(names) {
		t.Errorf("%d reports stored, want %d", len(got), writers*batches*len(names))
	}
}

// TestScheduleNearThePayloadLimitFires: a schedule whose payload is within
// the broker's limit as given fires, although jsonb gives it back with
// spaces that take it over the limit; one over the limit as given is
// refused when it is stored, with a clear error, not on every fire.
func TestScheduleNearThePayloadLimitFires(t *testing.T) {
	ctx := t.Context()
	b := newTestBroker(t, Options{MaxPayload: 36})
	payload := json.RawMessage(`{"a":1,"b":2,"c":3,"d":4,"e":5}`) // 31 bytes; jsonb gives back 40
	if _, err := b.PutSchedule(ctx, broker.Schedule{Name: "s", Task: "t", Topic: "q", Payload: payload, IntervalSeconds: 60, Enabled: true}); err != nil {
		t.Fatal(err)
	}
	s, err := b.GetSchedule(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Payload) <= 36 {
		t.Fatalf("stored payload %s is %d bytes: the test needs one that comes back over the limit", s.Payload, len(s.Payload))
	}
	res, err := b.FireSchedule(ctx, broker.FireRequest{Name: "s", Slot: time.Now().Truncate(time.Minute),
		Submit: &broker.SubmitRequest{Topic: "q", Task: "t", Payload: s.Payload}})
	if err != nil || !res.Fired || res.MessageID == 0 {
		t.Fatalf("FireSchedule = %+v, %v; want it fired with a message", res, err)
	}
	big := json.RawMessage(`{"a":"` + strings.Repeat("x", 36) + `"}`)
	if _, err := b.PutSchedule(ctx, broker.Schedule{Name: "big", Task: "t", Topic: "q", Payload: big, IntervalSeconds: 60, Enabled: true}); !errors.Is(err, broker.ErrInvalid) || !strings.Contains(err.Error(), "the limit is 36") {
		t.Fatalf("PutSchedule over the limit: %v, want ErrInvalid naming the limit", err)
	}
}
