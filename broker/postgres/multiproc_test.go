package postgres

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/internal/testdb"
)

// The claimer processes of TestConcurrencyLimitAcrossProcesses are this
// test binary run again with these variables set.
const (
	helperDSNEnv    = "TW_PG_HELPER_DSN"
	helperSchemaEnv = "TW_PG_HELPER_SCHEMA"
	helperWorkerEnv = "TW_PG_HELPER_WORKER"
	helperLinePfx   = "TWHELPER "
	limitedTopic    = "limited"
)

// TestConcurrencyLimitAcrossProcesses: three OS processes, each with its
// own broker (own pool, own connections), claim from one topic with a
// concurrency limit of 2. Two independent witnesses check the limit: a
// sampler that counts running rows from outside, and a statement trigger
// that counts them inside every claiming transaction (after the claim,
// while it holds the topic lock, so it sees the exact count the claim
// produced). Every message must end done, acked exactly once.
func TestConcurrencyLimitAcrossProcesses(t *testing.T) {
	const (
		limit = 2
		total = 300
		procs = 3
	)
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	c := schemaConn(t, b)
	schema := pgx.Identifier{b.schema}.Sanitize()

	if _, err := b.SetTopic(ctx, limitedTopic, broker.TopicPatch{ConcurrencyLimit: ptr(limit), Paused: ptr(true)}); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`CREATE TABLE tw_test_audit (running int NOT NULL)`,
		`CREATE FUNCTION tw_test_audit_running() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO ` + schema + `.tw_test_audit (running)
			SELECT (SELECT count(*) FROM ` + schema + `.tw_messages WHERE topic = '` + limitedTopic + `' AND state = 'running')
				+ (SELECT coalesce(sum(cardinality(ids)), 0) FROM ` + schema + `.tw_claims WHERE topic = '` + limitedTopic + `');
			RETURN NULL;
		END $$`,
		`CREATE TRIGGER tw_test_audit AFTER UPDATE ON tw_messages FOR EACH STATEMENT EXECUTE FUNCTION tw_test_audit_running()`,
		`CREATE TRIGGER tw_test_audit AFTER INSERT OR UPDATE ON tw_claims FOR EACH STATEMENT EXECUTE FUNCTION tw_test_audit_running()`,
		`INSERT INTO tw_messages (topic, task, payload) SELECT '` + limitedTopic + `', 'x', jsonb_build_object('n', i) FROM generate_series(1, ` + strconv.Itoa(total) + `) i`,
	} {
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	runCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	type proc struct {
		cmd *exec.Cmd
		out bytes.Buffer
	}
	var ps []*proc
	for i := range procs {
		p := &proc{cmd: exec.CommandContext(runCtx, os.Args[0], "-test.run=^TestHelperClaimer$", "-test.count=1", "-test.v")}
		p.cmd.Env = append(os.Environ(),
			helperDSNEnv+"="+testdb.DSN(),
			helperSchemaEnv+"="+b.schema,
			helperWorkerEnv+"="+fmt.Sprintf("proc-%d", i))
		p.cmd.Stdout = &p.out
		p.cmd.Stderr = &p.out
		if err := p.cmd.Start(); err != nil {
			t.Fatalf("starting claimer process %d: %v", i, err)
		}
		ps = append(ps, p)
	}

	// Start when all three are registered, so they really compete.
	deadline := time.Now().Add(time.Minute)
	for {
		ws, err := b.Workers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ws) == procs {
			break
		}
		if time.Now().After(deadline) {
			for _, p := range ps {
				_ = p.cmd.Process.Kill()
			}
			t.Fatalf("only %d of %d claimer processes registered", len(ws), procs)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The sampler, on its own connection.
	sc := schemaConn(t, b)
	var (
		stop      = make(chan struct{})
		samplerWG sync.WaitGroup
		sampled   int
		maxSeen   int
		busy      int // samples with something running
		samplErr  error
	)
	samplerWG.Add(1)
	go func() {
		defer samplerWG.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			var n int
			if err := sc.QueryRow(ctx, `SELECT (SELECT count(*) FROM tw_messages WHERE topic = $1 AND state = 'running')
				+ (SELECT coalesce(sum(cardinality(ids)), 0) FROM tw_claims WHERE topic = $1)`, limitedTopic).Scan(&n); err != nil {
				samplErr = err
				return
			}
			sampled++
			maxSeen = max(maxSeen, n)
			if n > 0 {
				busy++
			}
		}
	}()

	if _, err := b.SetTopic(ctx, limitedTopic, broker.TopicPatch{Paused: ptr(false)}); err != nil {
		t.Fatal(err)
	}
	var failed bool
	for i, p := range ps {
		if err := p.cmd.Wait(); err != nil {
			failed = true
			t.Errorf("claimer process %d: %v\n%s", i, err, p.out.String())
		}
	}
	close(stop)
	samplerWG.Wait()
	if failed {
		t.FailNow()
	}
	if samplErr != nil {
		t.Fatalf("sampler: %v", samplErr)
	}
	t.Logf("sampler: %d samples, %d with claims running, at most %d running", sampled, busy, maxSeen)
	if maxSeen > limit {
		t.Errorf("the sampler saw %d running, limit %d", maxSeen, limit)
	}
	if busy == 0 {
		t.Errorf("the sampler never saw a claim running: it did not watch the run")
	}

	var auditMax, audits int
	if err := c.QueryRow(ctx, `SELECT coalesce(max(running), 0), count(*) FROM tw_test_audit`).Scan(&auditMax, &audits); err != nil {
		t.Fatal(err)
	}
	t.Logf("audit trigger: %d statements, at most %d running", audits, auditMax)
	if auditMax > limit {
		t.Errorf("inside a claiming transaction %d were running, limit %d", auditMax, limit)
	}

	// Every message acked exactly once, by the processes' own account and
	// by the database's.
	acks := make(map[int64]int)
	claimsBy := make(map[string]int)
	for i, p := range ps {
		sc := bufio.NewScanner(bytes.NewReader(p.out.Bytes()))
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), helperLinePfx)
			if !ok {
				continue
			}
			f := strings.Fields(line)
			if len(f) != 2 {
				continue
			}
			id, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatalf("process %d printed %q", i, sc.Text())
			}
			switch f[0] {
			case "ack":
				acks[id]++
			case "claim":
				claimsBy[fmt.Sprintf("proc-%d", i)]++
			}
		}
	}
	t.Logf("claims per process: %v", claimsBy)
	if len(claimsBy) < 2 {
		t.Errorf("only %d processes claimed anything: the run did not exercise cross-process contention", len(claimsBy))
	}
	if len(acks) != total {
		t.Errorf("%d distinct messages acked, want %d", len(acks), total)
	}
	for id, n := range acks {
		if n != 1 {
			t.Errorf("message %d acked %d times, want once", id, n)
		}
	}
	var done, other int
	if err := c.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state <> 'done') FROM tw_messages_all`).
		Scan(&done, &other); err != nil {
		t.Fatal(err)
	}
	if done != total || other != 0 {
		t.Fatalf("database: %d done and %d not, want %d done", done, other, total)
	}
}

// TestHelperClaimer is the claimer process of
// TestConcurrencyLimitAcrossProcesses; run directly it does nothing. It
// registers, then loops claim (Max 1..3), hold briefly, ack (sometimes a
// requeueing nack first; half the time the ack is an AckAndClaim whose
// claim is the next round's), printing each claim and successful ack,
// until the topic has nothing queued or running.
func TestHelperClaimer(t *testing.T) {
	dsn, schema, worker := os.Getenv(helperDSNEnv), os.Getenv(helperSchemaEnv), os.Getenv(helperWorkerEnv)
	if dsn == "" || schema == "" || worker == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := New(ctx, Options{DSN: dsn, Schema: schema, MaxConns: 2})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer b.Close()
	if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: worker, PID: os.Getpid(), Topics: []string{limitedTopic}}); err != nil {
		t.Fatalf("RegisterWorker: %v", err)
	}
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(time.Now().UnixNano())))
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	var carried []broker.Message // claimed by the last AckAndClaim
	for {
		if ctx.Err() != nil {
			t.Fatalf("gave up: %v", ctx.Err())
		}
		msgs := carried
		carried = nil
		var err error
		if len(msgs) == 0 {
			msgs, err = b.Claim(ctx, broker.ClaimRequest{WorkerID: worker, Topics: []string{limitedTopic}, Max: 1 + rng.IntN(3)})
		}
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		if len(msgs) == 0 {
			st, err := b.Stats(ctx)
			if err != nil {
				t.Fatalf("Stats: %v", err)
			}
			for _, ts := range st.Topics {
				if ts.Name == limitedTopic && !ts.Paused && ts.Queued == 0 && ts.Running == 0 {
					return
				}
			}
			time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond)
			continue
		}
		for _, m := range msgs {
			fmt.Fprintf(out, "%sclaim %d\n", helperLinePfx, m.ID)
		}
		time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
		var outcomes []broker.Outcome
		for _, m := range msgs {
			if m.Attempts < 2 && rng.IntN(6) == 0 {
				if err := b.Nack(ctx, broker.NackRequest{Claim: m.ClaimOf(), Requeue: true, Error: "retry"}); err != nil {
					t.Fatalf("Nack(%d): %v", m.ID, err)
				}
				continue
			}
			outcomes = append(outcomes, broker.Outcome{Claim: m.ClaimOf()})
		}
		if len(outcomes) == 0 {
			continue
		}
		// Half the time the acks go with the next claim, in one
		// transaction (the worker pool's way).
		var errs []error
		if rng.IntN(2) == 0 {
			errs, carried, err = b.AckAndClaim(ctx, outcomes, broker.ClaimRequest{WorkerID: worker, Topics: []string{limitedTopic}, Max: 1 + rng.IntN(3)})
		} else {
			errs, err = b.Ack(ctx, outcomes)
		}
		if err != nil {
			t.Fatalf("Ack: %v", err)
		}
		for i, e := range errs {
			if e != nil {
				t.Fatalf("Ack(%d): %v", outcomes[i].Claim.ID, e)
			}
			fmt.Fprintf(out, "%sack %d\n", helperLinePfx, outcomes[i].Claim.ID)
		}
	}
}
