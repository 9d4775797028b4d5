// Command acrosshosts submits no-op tasks to a host's API at a steady rate,
// for bench/across-hosts.sh.
//
// Each submit starts at its own time on a fixed schedule (t0 + i/rate),
// whatever the earlier ones took, from a set of goroutines, so the rate
// holds while the host keeps up. It prints how many were submitted, how
// many failed, how many started more than 10 ms late, and the client's
// round trip of Submit (HTTP request and answer) as p50, p99 and max.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taskhost/taskhost/client"
)

func main() {
	addr := flag.String("addr", "http://127.0.0.1:18201", "the host's address")
	token := flag.String("token", os.Getenv("TASKHOST_ADMIN_TOKEN"), "the host's admin_token, if it has one")
	task := flag.String("task", "demo.echo", "the task to submit")
	topic := flag.String("topic", "", "the topic to submit on (empty: the task's own)")
	rate := flag.Float64("rate", 500, "submits per second")
	dur := flag.Duration("duration", 30*time.Second, "how long to submit")
	conc := flag.Int("goroutines", 64, "submitting goroutines")
	flag.Parse()
	if *rate <= 0 || *dur <= 0 || *conc <= 0 {
		fmt.Fprintln(os.Stderr, "acrosshosts: -rate, -duration and -goroutines must be positive")
		os.Exit(2)
	}

	c := client.New(*addr, client.WithToken(*token), client.WithRetry(client.RetryPolicy{}))
	n := int(*rate * dur.Seconds())
	interval := time.Duration(float64(time.Second) / *rate)
	due := make(chan time.Time, n)
	var (
		failed, late atomic.Int64
		mu           sync.Mutex
		trips        = make([]time.Duration, 0, n)
		firstErr     error
		wg           sync.WaitGroup
	)
	for range *conc {
		wg.Go(func() {
			for at := range due {
				if d := time.Until(at); d > 0 {
					time.Sleep(d)
				} else if -d > 10*time.Millisecond {
					late.Add(1)
				}
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := c.Submit(ctx, client.Task{Task: *task, Topic: *topic})
				cancel()
				trip := time.Since(start)
				mu.Lock()
				if err != nil {
					failed.Add(1)
					if firstErr == nil {
						firstErr = err
					}
				} else {
					trips = append(trips, trip)
				}
				mu.Unlock()
			}
		})
	}
	t0 := time.Now().Add(50 * time.Millisecond)
	for i := range n {
		due <- t0.Add(time.Duration(i) * interval)
	}
	close(due)
	wg.Wait()
	elapsed := time.Since(t0)

	slices.Sort(trips)
	q := func(p float64) float64 {
		if len(trips) == 0 {
			return 0
		}
		return float64(trips[min(len(trips)-1, int(p*float64(len(trips))))].Microseconds()) / 1000
	}
	fmt.Printf("submitted %d of %d in %.1f s (%.0f/s), failed %d, started >10 ms late %d; Submit round trip p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
		len(trips), n, elapsed.Seconds(), float64(len(trips))/elapsed.Seconds(), failed.Load(), late.Load(), q(0.5), q(0.99), q(1))
	if firstErr != nil {
		fmt.Fprintln(os.Stderr, "acrosshosts: first error:", firstErr)
		os.Exit(1)
	}
}
