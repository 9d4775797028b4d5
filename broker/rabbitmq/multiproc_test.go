package rabbitmq

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/internal/testdb"
)

// The claimer processes of TestLimitAcrossProcesses are this test binary
// run again as TestHelperClaimer with these variables set: a process
// test of the rabbitmq broker starts its processes the same way.
const (
	helperURLEnv      = "TASKHOST_RABBIT_HELPER_URL"
	helperPrefixEnv   = "TASKHOST_RABBIT_HELPER_PREFIX"
	helperSchemaEnv   = "TASKHOST_RABBIT_HELPER_SCHEMA"
	helperWorkerEnv   = "TASKHOST_RABBIT_HELPER_WORKER"
	helperClaimersEnv = "TASKHOST_RABBIT_HELPER_CLAIMERS"
	helperLinePrefix  = "RABBITHELPER acked "
	helperTopic       = "limited"
)

// TestLimitAcrossProcesses: 16 claimers in three OS processes, each
// process with its own broker (its own connection to RabbitMQ and pool on
// the postgres state store), claim from one topic limited to 2. A sampler
// counts the running rows from outside all along: never more than 2.
// Every message ends done, acked exactly once.
func TestLimitAcrossProcesses(t *testing.T) {
	const (
		limit = 2
		total = 150
	)
	claimers := []int{6, 5, 5}
	b := openTest(t, onPostgres, Options{})
	ctx := t.Context()
	schema := b.state.(*postgres.Broker).Schema()
	if _, err := b.SetTopic(ctx, helperTopic, broker.TopicPatch{ConcurrencyLimit: ptr(limit), Paused: ptr(true)}); err != nil {
		t.Fatal(err)
	}
	reqs := make([]broker.SubmitRequest, total)
	for i := range reqs {
		reqs[i] = broker.SubmitRequest{Topic: helperTopic, Task: "task"}
	}
	if _, err := b.SubmitMany(ctx, reqs); err != nil {
		t.Fatal(err)
	}

	runCtx, cancel := context.WithTimeout(ctx, 6*time.Minute)
	defer cancel()
	type proc struct {
		cmd *exec.Cmd
		out bytes.Buffer
	}
	var ps []*proc
	for i, n := range claimers {
		p := &proc{cmd: exec.CommandContext(runCtx, os.Args[0], "-test.run=^TestHelperClaimer$", "-test.count=1", "-test.v")}
		p.cmd.Env = append(os.Environ(),
			helperURLEnv+"="+b.opts.URL, helperPrefixEnv+"="+b.opts.Prefix, helperSchemaEnv+"="+schema,
			helperWorkerEnv+"="+fmt.Sprintf("proc-%d", i), helperClaimersEnv+"="+strconv.Itoa(n))
		p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
		if err := p.cmd.Start(); err != nil {
			t.Fatalf("starting claimer process %d: %v", i, err)
		}
		ps = append(ps, p)
	}
	registered := func() bool {
		ws, err := b.Workers(ctx)
		return err == nil && len(ws) == len(claimers)
	}
	for deadline := time.Now().Add(3 * time.Minute); !registered(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			cancel()
			for i, p := range ps {
				_ = p.cmd.Wait()
				t.Logf("claimer process %d:\n%s", i, p.out.String())
			}
			t.Fatalf("the %d claimer processes did not all register within 3 minutes", len(claimers))
		}
	}
	// The sampler runs before the topic is unpaused, so that it watches the
	// whole run however late a loaded machine schedules it.
	sc := testdb.Connect(t, schema)
	var (
		stop     = make(chan struct{})
		sampling = make(chan struct{})
		wg       sync.WaitGroup
		maxSeen  int
		busy     int
		sErr     error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		first := true
		defer func() {
			if first {
				close(sampling)
			}
		}()
		for ; ; first = false {
			select {
			case <-stop:
				return
			default:
			}
			var n int
			if err := sc.QueryRow(ctx, `SELECT count(*) FROM tw_messages WHERE topic = $1 AND state = 'running'`, helperTopic).Scan(&n); err != nil {
				sErr = err
				return
			}
			maxSeen = max(maxSeen, n)
			if n > 0 {
				busy++
			}
			if first {
				close(sampling)
			}
		}
	}()
	select {
	case <-sampling:
	case <-time.After(3 * time.Minute):
		t.Fatal("the sampler took no sample within 3 minutes")
	}
	if _, err := b.SetTopic(ctx, helperTopic, broker.TopicPatch{Paused: ptr(false)}); err != nil {
		t.Fatal(err)
	}
	acked := make(map[int64]int)
	for i, p := range ps {
		err := p.cmd.Wait()
		if err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("claimer process %d: %v\n%s", i, err, p.out.String())
		}
		sc := bufio.NewScanner(bytes.NewReader(p.out.Bytes()))
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), helperLinePrefix); ok {
				id, err := strconv.ParseInt(rest, 10, 64)
				if err != nil {
					t.Fatalf("claimer process %d printed %q", i, sc.Text())
				}
				acked[id]++
			}
		}
	}
	close(stop)
	wg.Wait()
	if sErr != nil {
		t.Fatalf("sampler: %v", sErr)
	}
	if busy == 0 {
		t.Fatal("the sampler never saw a message running: it witnessed nothing")
	}
	if maxSeen > limit {
		t.Fatalf("the sampler saw %d messages running at once, limit %d", maxSeen, limit)
	}
	if len(acked) != total {
		t.Fatalf("%d distinct messages acked, want %d", len(acked), total)
	}
	for id, n := range acked {
		if n != 1 {
			t.Errorf("message %d acked %d times, want once", id, n)
		}
	}
	st, err := b.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range st.Topics {
		if ts.Name == helperTopic && (ts.Queued != 0 || ts.Running != 0) {
			t.Fatalf("after the run: %d queued, %d running, want none", ts.Queued, ts.Running)
		}
	}
}

// TestHelperClaimer is a claimer process of TestLimitAcrossProcesses; run
// on its own it does nothing.
func TestHelperClaimer(t *testing.T) {
	url := os.Getenv(helperURLEnv)
	if url == "" {
		t.Log("a helper of TestLimitAcrossProcesses; nothing to do on its own")
		return
	}
	ctx := context.Background()
	worker := os.Getenv(helperWorkerEnv)
	claimers, err := strconv.Atoi(os.Getenv(helperClaimersEnv))
	if err != nil {
		t.Fatal(err)
	}
	s, err := postgres.New(ctx, postgres.Options{DSN: testdb.DSN(), Schema: os.Getenv(helperSchemaEnv)})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(ctx, Options{URL: url, Prefix: os.Getenv(helperPrefixEnv), State: s})
	if err != nil {
		_ = s.Close()
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: worker, Roles: []string{broker.RoleWorker}, Topics: []string{helperTopic}}); err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		out = bufio.NewWriter(os.Stdout)
		wg  sync.WaitGroup
	)
	for c := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("%s-%d", worker, c)
			for {
				ms, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: id, Topics: []string{helperTopic}, Max: 2})
				if err != nil {
					t.Errorf("Claim: %v", err)
					return
				}
				if len(ms) == 0 {
					if done(t, b) {
						return
					}
					time.Sleep(2 * time.Millisecond)
					continue
				}
				for _, m := range ms {
					errs, err := b.Ack(ctx, []broker.Outcome{{Claim: m.ClaimOf()}})
					if err != nil || errs[0] != nil {
						t.Errorf("Ack(%d): %v %v", m.ID, errs, err)
						return
					}
					mu.Lock()
					fmt.Fprintf(out, "%s%d\n", helperLinePrefix, m.ID)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	_ = out.Flush()
	mu.Unlock()
}

// done reports whether the limited topic has nothing queued or running.
func done(t *testing.T, b *Broker) bool {
	st, err := b.Stats(context.Background())
	if err != nil {
		t.Errorf("Stats: %v", err)
		return true
	}
	for _, ts := range st.Topics {
		if ts.Name == helperTopic {
			return ts.Queued == 0 && ts.Running == 0
		}
	}
	return true
}

func ptr[T any](v T) *T { return &v }
