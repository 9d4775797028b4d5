package brokertest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/taskhost/taskhost/broker"
)

// The cases of unique keys across processes: a broker's test starts
// several OS processes on one store, each running SubmitUniqueRounds, and
// checks their outputs with CheckUniqueRounds.
const (
	// UniqueProcTopic is the topic the processes submit to.
	UniqueProcTopic = "uniq-procs"
	// UniqueProcRounds is how many keys each process submits.
	UniqueProcRounds = 40
	// uniqueProcFanout is how many submits of each key a process sends
	// at once.
	uniqueProcFanout = 4
	uniqueLinePrefix = "UNIQ "
)

// SubmitUniqueRounds submits, for each of UniqueProcRounds keys in turn,
// uniqueProcFanout concurrent submits of that key through b, and writes a
// line per submit to w for CheckUniqueRounds.
func SubmitUniqueRounds(ctx context.Context, b broker.Broker, w io.Writer) error {
	var mu sync.Mutex
	for r := range UniqueProcRounds {
		key := fmt.Sprintf("key-%d", r)
		errs := make([]error, uniqueProcFanout)
		var wg sync.WaitGroup
		for i := range uniqueProcFanout {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id, err := b.Submit(ctx, broker.SubmitRequest{Topic: UniqueProcTopic, Task: "k", UniqueKey: key})
				what := "new"
				if holder, dup := broker.DuplicateOf(err); dup {
					id, what, err = holder, "dup", nil
				}
				if err != nil {
					errs[i] = err
					return
				}
				mu.Lock()
				fmt.Fprintf(w, "%s%s %s %d\n", uniqueLinePrefix, key, what, id)
				mu.Unlock()
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return fmt.Errorf("submit of %s: %w", key, err)
			}
		}
	}
	return nil
}

// CheckUniqueRounds checks the outputs of the processes that ran
// SubmitUniqueRounds on b's store: every submit answered, each key was
// created by exactly one submit of all processes, every duplicate names
// that message, and b stores one message per key.
func CheckUniqueRounds(t *testing.T, b broker.Broker, outputs []string) {
	t.Helper()
	created := map[string]int64{}
	answers := map[string][]int64{}
	lines := 0
	for p, out := range outputs {
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), uniqueLinePrefix)
			if !ok {
				continue
			}
			var key, what string
			var id int64
			if _, err := fmt.Sscanf(line, "%s %s %d", &key, &what, &id); err != nil {
				t.Fatalf("process %d: line %q: %v", p, line, err)
			}
			lines++
			answers[key] = append(answers[key], id)
			if what == "new" {
				if prev, dup := created[key]; dup {
					t.Fatalf("key %s created twice: messages %d and %d", key, prev, id)
				}
				created[key] = id
			}
		}
	}
	if want := len(outputs) * UniqueProcRounds * uniqueProcFanout; lines != want {
		t.Fatalf("%d answers from the processes, want %d", lines, want)
	}
	for key, ids := range answers {
		id, ok := created[key]
		if !ok {
			t.Fatalf("key %s: no submit created it (answers %v)", key, ids)
		}
		for _, got := range ids {
			if got != id {
				t.Fatalf("key %s: answers %v, want all %d", key, ids, id)
			}
		}
	}
	msgs, err := b.ListMessages(context.Background(), broker.MessageFilter{Topic: UniqueProcTopic, Limit: broker.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != UniqueProcRounds {
		t.Fatalf("%d messages stored, want one per key (%d)", len(msgs), UniqueProcRounds)
	}
	for _, m := range msgs {
		if created[m.UniqueKey] != m.ID {
			t.Fatalf("message %d (key %q) is not the one its key's submit created (%d)", m.ID, m.UniqueKey, created[m.UniqueKey])
		}
	}
}
