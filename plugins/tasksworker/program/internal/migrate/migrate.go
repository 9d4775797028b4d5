// Package migrate is `host migrate`, which the host runs as
// `fp-plugin-tasks_worker migrate`: it runs the PostgreSQL broker's
// migrations. The host hands it the tasks_worker plugin's config block on
// stdin, as it does for check-config, so the binary reads no host config.
// The DSN comes from -dsn, else the block's dsn, else
// TASKHOST_DATABASE_URL; the schema from -schema, else the block's.
package migrate

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/plugins/tasksworker"
)

// maxBlock bounds the config block read from stdin, as check-config's.
const maxBlock = 64 << 20

// Main runs `host migrate` with args (what follows "migrate") and the
// config block on stdin, and returns its exit status: 0 done, 1 failed, 2
// a usage error or no database.
func Main(args []string) int {
	return run(args, os.Stdin, os.Stdout, os.Stderr)
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsn := fs.String("dsn", "", "PostgreSQL address (default: the config block's dsn, then $"+tasksworker.DSNEnv+")")
	schema := fs.String("schema", "", "schema holding the tables (default: the config block's schema, then public)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: fp-plugin-tasks_worker migrate [-dsn DSN] [-schema S] < config-block.json\n\nRun by `host migrate`, which hands it the tasks_worker config block on stdin.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	block, err := readBlock(stdin)
	if err != nil {
		fmt.Fprintf(stderr, "host migrate: %v\n", err)
		return 2
	}
	if *dsn == "" {
		*dsn = block.DSN
	}
	if *schema == "" {
		*schema = block.Schema
	}
	if *dsn == "" {
		*dsn = os.Getenv(tasksworker.DSNEnv)
	}
	if *dsn == "" {
		fmt.Fprintf(stderr, "host migrate: no database: pass -dsn, set dsn in the tasks_worker config, or set %s\n", tasksworker.DSNEnv)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := postgres.Migrate(ctx, *dsn, *schema); err != nil {
		fmt.Fprintf(stderr, "host migrate: %v\n", err)
		return 1
	}
	s := *schema
	if s == "" {
		s = "public"
	}
	fmt.Fprintf(stdout, "migrated: schema %s is up to date\n", s)
	return 0
}

// block is what migrate reads of the config block: only where the tables
// are, so that a block the plugin would refuse for another setting still
// migrates.
type block struct {
	DSN    string `json:"dsn"`
	Schema string `json:"schema"`
}

// readBlock reads the config block from stdin: nothing from a terminal (a
// person running the binary by hand), and an empty block is no block.
func readBlock(stdin io.Reader) (block, error) {
	var b block
	if f, ok := stdin.(*os.File); ok {
		if info, err := f.Stat(); err == nil && info.Mode()&os.ModeCharDevice != 0 {
			return b, nil
		}
	}
	raw, err := io.ReadAll(io.LimitReader(stdin, maxBlock))
	if err != nil {
		return b, fmt.Errorf("reading the config block on stdin: %w", err)
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return b, nil
	}
	if err := json.Unmarshal(raw, &b); err != nil {
		return b, fmt.Errorf("the config block on stdin is not a JSON object: %w", err)
	}
	return b, nil
}
