package postgres

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker/brokertest"
	"github.com/taskhost/taskhost/internal/testdb"
)

const helperUniqueStartEnv = "TW_PG_HELPER_UNIQUE_START"

// TestUniqueAcrossProcesses: three OS processes, each with its own broker,
// submit the same keys at the same time; each key is stored once.
func TestUniqueAcrossProcesses(t *testing.T) {
	const procs = 3
	b := newTestBroker(t, Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	start := time.Now().Add(2 * time.Second).UnixNano()
	cmds := make([]*exec.Cmd, procs)
	bufs := make([]*bytes.Buffer, procs)
	for i := range cmds {
		cmds[i] = exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperUniqueSubmitter$", "-test.count=1", "-test.v")
		cmds[i].Env = append(os.Environ(), helperDSNEnv+"="+testdb.DSN(), helperSchemaEnv+"="+b.schema,
			helperUniqueStartEnv+"="+strconv.FormatInt(start, 10))
		bufs[i] = &bytes.Buffer{}
		cmds[i].Stdout, cmds[i].Stderr = bufs[i], bufs[i]
		if err := cmds[i].Start(); err != nil {
			t.Fatalf("start submitter %d: %v", i, err)
		}
	}
	outs := make([]string, procs)
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("submitter %d: %v\n%s", i, err, bufs[i])
		}
		outs[i] = bufs[i].String()
	}
	brokertest.CheckUniqueRounds(t, b, outs)
}

// TestHelperUniqueSubmitter is a process of TestUniqueAcrossProcesses; run
// directly it does nothing.
func TestHelperUniqueSubmitter(t *testing.T) {
	dsn, schema := os.Getenv(helperDSNEnv), os.Getenv(helperSchemaEnv)
	startAt := os.Getenv(helperUniqueStartEnv)
	if dsn == "" || schema == "" || startAt == "" {
		return
	}
	start, _ := strconv.ParseInt(startAt, 10, 64)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := New(ctx, Options{DSN: dsn, Schema: schema, MaxConns: 4})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer b.Close()
	// Start together with the others, so their submits overlap.
	time.Sleep(time.Until(time.Unix(0, start)))
	if err := brokertest.SubmitUniqueRounds(ctx, b, os.Stdout); err != nil {
		t.Fatal(err)
	}
}
