package chaos

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The proxy stands between each host namespace and PostgreSQL: one
// listener per host (on the root end of its veth), each forwarding to the
// database. Each listener has a mode, changed at any time, that applies to
// its connections chunk by chunk:
//
//   - pass: bytes flow;
//   - blackhole: nothing flows either way (new connections are accepted and
//     hang; what was sent waits in the proxy and flows once healed), as a
//     link that silently drops everything;
//   - flaky: each chunk is delayed, sometimes a connection stalls for a
//     while, sometimes it is reset (RST both ways).
//
// resetAll cuts every connection of a listener with a RST.

type pxMode int32

const (
	pxPass pxMode = iota
	pxBlackhole
	pxFlaky
)

// flakiness tunes the flaky mode.
type flakiness struct {
	maxDelay   time.Duration // each chunk waits up to this
	stallProb  float64       // per chunk: the connection stalls
	stallMin   time.Duration
	stallMax   time.Duration
	resetProb  float64 // per chunk: the connection is reset
	minLifeRst time.Duration
}

type pxListener struct {
	name   string
	ln     net.Listener
	target string
	mode   atomic.Int32
	flaky  flakiness

	mu    sync.Mutex
	conns map[*pxConn]struct{}

	accepted, resets, stalls atomic.Int64
}

type pxConn struct {
	client, upstream *net.TCPConn
	born             time.Time
	isClosed         atomic.Bool
}

// listen starts a listener at addr forwarding to target until the test ends.
func listen(t *testing.T, name, addr, target string) *pxListener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("proxy %s: %v", name, err)
	}
	l := &pxListener{name: name, ln: ln, target: target, conns: map[*pxConn]struct{}{}}
	t.Cleanup(func() {
		ln.Close()
		l.resetAll()
	})
	go l.accept()
	return l
}

func (l *pxListener) setMode(m pxMode) { l.mode.Store(int32(m)) }

func (l *pxListener) accept() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.accepted.Add(1)
		go l.serve(c.(*net.TCPConn))
	}
}

func (l *pxListener) serve(client *net.TCPConn) {
	up, err := net.DialTimeout("tcp", l.target, 5*time.Second)
	if err != nil {
		_ = client.SetLinger(0)
		client.Close()
		return
	}
	pc := &pxConn{client: client, upstream: up.(*net.TCPConn), born: time.Now()}
	l.mu.Lock()
	l.conns[pc] = struct{}{}
	l.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { l.pipe(pc, pc.upstream, pc.client) })
	wg.Go(func() { l.pipe(pc, pc.client, pc.upstream) })
	wg.Wait()
	l.mu.Lock()
	delete(l.conns, pc)
	l.mu.Unlock()
}

// pipe copies src to dst chunk by chunk, each through the gate.
func (l *pxListener) pipe(pc *pxConn, dst, src *net.TCPConn) {
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !l.gate(pc) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				pc.close(false)
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				_ = dst.CloseWrite()
				return
			}
			pc.close(false)
			return
		}
	}
}

// gate holds a chunk as the mode says; false when the connection was reset.
func (l *pxListener) gate(pc *pxConn) bool {
	for {
		switch pxMode(l.mode.Load()) {
		case pxPass:
			return true
		case pxBlackhole:
			if pc.closed() {
				return false
			}
			time.Sleep(20 * time.Millisecond)
			continue
		case pxFlaky:
			f := l.flaky
			r := rand.Float64()
			switch {
			case r < f.resetProb && time.Since(pc.born) > f.minLifeRst:
				l.resets.Add(1)
				pc.close(true)
				return false
			case r < f.resetProb+f.stallProb:
				l.stalls.Add(1)
				time.Sleep(f.stallMin + rand.N(f.stallMax-f.stallMin+1))
			}
			if f.maxDelay > 0 {
				time.Sleep(rand.N(f.maxDelay))
			}
			return !pc.closed()
		}
	}
}

func (pc *pxConn) closed() bool { return pc.isClosed.Load() }

// close ends both sides; with rst, with a RST each way.
func (pc *pxConn) close(rst bool) {
	if pc.isClosed.Swap(true) {
		return
	}
	if rst {
		_ = pc.client.SetLinger(0)
		_ = pc.upstream.SetLinger(0)
	}
	pc.client.Close()
	pc.upstream.Close()
}

// resetAll resets every open connection of the listener.
func (l *pxListener) resetAll() int {
	l.mu.Lock()
	var cs []*pxConn
	for c := range l.conns {
		cs = append(cs, c)
	}
	l.mu.Unlock()
	for _, c := range cs {
		c.close(true)
	}
	return len(cs)
}
