package migrate

import (
	"strings"
	"testing"

	"github.com/taskhost/taskhost/plugins/tasksworker"
)

// TestTheConfigBlockNamesTheDatabase: the block on stdin gives the dsn and
// schema unless the flags do, and without a database anywhere migrate
// says where one comes from.
func TestTheConfigBlockNamesTheDatabase(t *testing.T) {
	t.Setenv(tasksworker.DSNEnv, "")
	b, err := readBlock(strings.NewReader(`{"broker": "postgres", "dsn": "postgres://x", "schema": "s", "workers": "not checked here"}`))
	if err != nil || b.DSN != "postgres://x" || b.Schema != "s" {
		t.Fatalf("readBlock = %+v, %v; want the block's dsn and schema", b, err)
	}
	for _, in := range []string{"", " \n", "{}"} {
		var stderr strings.Builder
		if code := run(nil, strings.NewReader(in), &strings.Builder{}, &stderr); code != 2 || !strings.Contains(stderr.String(), "host migrate: no database: pass -dsn") {
			t.Errorf("block %q: status %d, stderr %q; want 2 and where a database comes from", in, code, stderr.String())
		}
	}
	var stderr strings.Builder
	if code := run(nil, strings.NewReader("broker: postgres"), &strings.Builder{}, &stderr); code != 2 || !strings.Contains(stderr.String(), "not a JSON object") {
		t.Errorf("a block that is not JSON: status %d, stderr %q", code, stderr.String())
	}
	// -dsn wins over the block's: an unreachable one fails to connect.
	stderr.Reset()
	if code := run([]string{"-dsn", "postgres://nobody@127.0.0.1:1/x"}, strings.NewReader(`{"dsn": "postgres://unused"}`), &strings.Builder{}, &stderr); code != 1 || !strings.Contains(stderr.String(), "127.0.0.1:1") {
		t.Errorf("-dsn over the block: status %d, stderr %q", code, stderr.String())
	}
}
