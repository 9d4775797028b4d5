package local

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/brokertest"
)

// Environment of TestHelperUniqueSubmitter.
const (
	envUniqueDB    = "TASKHOST_LOCAL_UNIQUE_DB"
	envUniqueStart = "TASKHOST_LOCAL_UNIQUE_START"
)

// TestUniqueAcrossProcesses: three OS processes on one file submit the
// same keys at the same time; each key is stored once.
func TestUniqueAcrossProcesses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "taskhost.db")
	b := openTest(t, Options{Path: path})
	start := time.Now().Add(2 * time.Second).UnixNano()
	outs := runUniqueProcs(t, 3, func(cmd *exec.Cmd) {
		cmd.Env = append(os.Environ(), envUniqueDB+"="+path, envUniqueStart+"="+strconv.FormatInt(start, 10))
	})
	brokertest.CheckUniqueRounds(t, b, outs)
}

// runUniqueProcs runs n processes of TestHelperUniqueSubmitter, set up by
// env, and returns their outputs.
func runUniqueProcs(t *testing.T, n int, env func(*exec.Cmd)) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmds := make([]*exec.Cmd, n)
	bufs := make([]*bytes.Buffer, n)
	for i := range cmds {
		cmds[i] = exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperUniqueSubmitter$", "-test.count=1", "-test.v")
		env(cmds[i])
		bufs[i] = &bytes.Buffer{}
		cmds[i].Stdout, cmds[i].Stderr = bufs[i], bufs[i]
		if err := cmds[i].Start(); err != nil {
			t.Fatalf("start submitter %d: %v", i, err)
		}
	}
	outs := make([]string, n)
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("submitter %d: %v\n%s", i, err, bufs[i])
		}
		outs[i] = bufs[i].String()
	}
	return outs
}

// TestHelperUniqueSubmitter is a process of TestUniqueAcrossProcesses;
// run directly it does nothing.
func TestHelperUniqueSubmitter(t *testing.T) {
	path := os.Getenv(envUniqueDB)
	if path == "" {
		return
	}
	start, _ := strconv.ParseInt(os.Getenv(envUniqueStart), 10, 64)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := Open(ctx, Options{Path: path})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer b.Close()
	// Start together with the others, so their submits overlap.
	time.Sleep(time.Until(time.Unix(0, start)))
	if err := brokertest.SubmitUniqueRounds(ctx, b, os.Stdout); err != nil {
		t.Fatal(err)
	}
}

// Housekeeping deletes the unique keys last used longer ago than any
// window, and keeps the others.
func TestHousekeepingPurgesOldUniqueKeys(t *testing.T) {
	b := openTest(t, Options{})
	old := time.Now().Add(-broker.MaxDelay - time.Hour).UnixNano()
	execSQL(t, b, `INSERT INTO tw_unique_keys (key, message_id, created_at) VALUES ('old', 1, ?), ('new', 2, ?)`, old, time.Now().UnixNano())
	if err := b.housekeep(context.Background()); err != nil {
		t.Fatal(err)
	}
	var keys []string
	rows, err := b.reader.Query(`SELECT key FROM tw_unique_keys`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if len(keys) != 1 || keys[0] != "new" {
		t.Fatalf("keys after housekeeping: %v, want [new]", keys)
	}
}
