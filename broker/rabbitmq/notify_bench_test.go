package rabbitmq

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/worker"
)

// BenchmarkLatencyAcrossProcesses: one process submits a message every
// 10 ms, and a worker pool in another process on the same prefix runs
// them; it reports the median and the 99th percentile of the time from
// the call of Submit (which returns once RabbitMQ confirmed the message)
// to the start of the task. "announced" is the broker as it
// is; "polling" hides its announcements from the pool, which then learns
// of a message only at its next claim (every 100 ms while idle).
//
//	go test ./broker/rabbitmq -run '^$' -bench LatencyAcrossProcesses -benchtime 300x -count 3
func BenchmarkLatencyAcrossProcesses(b *testing.B) {
	for _, mode := range []string{"announced", "polling"} {
		b.Run(mode, func(b *testing.B) {
			a, other := twoOnOneStore(b, Options{})
			var (
				mu      sync.Mutex
				sent    = make(map[int64]time.Time)
				latency []time.Duration
				ran     = make(chan struct{}, 1)
			)
			reg := worker.NewRegistry()
			reg.MustRegister(worker.Task{Name: "t", Topic: "lat", Handler: func(_ context.Context, tc *worker.TaskContext) (any, error) {
				now := time.Now()
				mu.Lock()
				for { // the submit may not have returned yet
					if at, ok := sent[tc.MessageID]; ok {
						latency = append(latency, now.Sub(at))
						break
					}
					mu.Unlock()
					time.Sleep(time.Millisecond)
					mu.Lock()
				}
				mu.Unlock()
				select {
				case ran <- struct{}{}:
				default:
				}
				return nil, nil
			}})
			var pb broker.Broker = other
			if mode == "polling" {
				pb = struct {
					broker.Broker
					broker.OrphanReclaimer
				}{other, other}
			}
			p := worker.NewPool(pb, reg, worker.Options{Logger: hclog.NewNullLogger()})
			if err := p.Start(b.Context()); err != nil {
				b.Fatal(err)
			}
			defer func() { _ = p.Stop(context.Background()) }()
			b.ResetTimer()
			for range b.N {
				mu.Lock()
				at := time.Now()
				id, err := a.Submit(b.Context(), broker.SubmitRequest{Topic: "lat", Task: "t"})
				sent[id] = at
				mu.Unlock()
				if err != nil {
					b.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			deadline := time.Now().Add(time.Minute)
			for {
				mu.Lock()
				n := len(latency)
				mu.Unlock()
				if n == b.N {
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("%d of %d messages ran within a minute", n, b.N)
				}
				select {
				case <-ran:
				case <-time.After(100 * time.Millisecond):
				}
			}
			b.StopTimer()
			slices.Sort(latency)
			b.ReportMetric(float64(latency[len(latency)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(latency[len(latency)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}
