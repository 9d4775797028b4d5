package worker

import (
	"math/rand/v2"
	"time"
)

// This file owns the backoff between retries of failing broker calls,
// shared by the dispatcher's claims, the completer's writes and the
// heartbeat.

// Broker errors are retried after retryMin, doubling up to retryMax: a
// blip costs little, and a database that is down is not hammered.
const (
	retryMin = 100 * time.Millisecond
	retryMax = 5 * time.Second
)

// backoff doubles from min to max, with +-20% jitter so that workers that
// lost the database together do not come back in lockstep.
type backoff struct {
	min, max, cur time.Duration
}

func retryBackoff() *backoff { return &backoff{min: retryMin, max: retryMax} }

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	jitter := time.Duration((rand.Float64()*0.4 - 0.2) * float64(b.cur))
	return b.cur + jitter
}

func (b *backoff) reset() { b.cur = 0 }
