package scheduler

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/internal/testdb"
)

// benchPasses measures the beat's passes over 10,000 schedules, of which
// due ones fire every second and the others hourly, on a clock that moves
// one second per pass: each pass has the due ones to fire. It reports the
// median pass time (ms/pass-median), and the mean as ns/op.
//
//	go test -run '^$' -bench BenchmarkPass -benchtime 20x ./scheduler/
//
// Medians on a shared 2-core machine, before (every schedule listed, one
// transaction per fire) and after (the due index, 100 fires to a
// transaction): PostgreSQL, 100 due: 375-470 ms, then 67-69 ms; 10,000
// due: 16.5-25.5 s, then 7.1-7.4 s. Memory, 100 due: 6-22 ms, then under
// 1 ms; 10,000 due: about 200-330 ms either way (the submits dominate).
func benchPasses(b *testing.B, sb scheduleBroker, due int) {
	const total = 10000
	ctx := context.Background()
	for i := range total {
		s := broker.Schedule{Name: fmt.Sprintf("s%05d", i), Task: "t", Topic: "q", IntervalSeconds: 3600, Enabled: true}
		if i < due {
			s.IntervalSeconds = 1
		}
		if _, err := sb.PutSchedule(ctx, s); err != nil {
			b.Fatal(err)
		}
	}
	lease, held, err := sb.TryLease(ctx, BeatLease, "h", time.Hour)
	if err != nil || !held {
		b.Fatalf("lease: %+v %v %v", lease, held, err)
	}
	fence := broker.Fence{Name: BeatLease, Holder: "h", Term: lease.Term}
	clock := time.Now().Add(2 * time.Second)
	tk := &Ticker{Store: sb, Now: func() time.Time { return clock },
		Lookup: func(task, topic string) (string, bool) { return "q", true }}
	if err := tk.Tick(ctx, fence); err != nil { // every schedule's first slot
		b.Fatal(err)
	}
	var passes []time.Duration
	b.ResetTimer()
	for range b.N {
		clock = clock.Add(time.Second)
		start := time.Now()
		if err := tk.Tick(ctx, fence); err != nil {
			b.Fatal(err)
		}
		passes = append(passes, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(passes)
	b.ReportMetric(float64(passes[len(passes)/2])/float64(time.Millisecond), "ms/pass-median")
}

func BenchmarkPass(b *testing.B) {
	for _, due := range []int{100, 10000} {
		b.Run(fmt.Sprintf("memory/due=%d", due), func(b *testing.B) {
			benchPasses(b, memory.New(), due)
		})
		b.Run(fmt.Sprintf("postgres/due=%d", due), func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pb, err := postgres.New(ctx, postgres.Options{DSN: testdb.DSN(), Schema: testdb.FreshSchema(b, "tw_bench_")})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = pb.Close() }()
			benchPasses(b, pb, due)
		})
	}
}
