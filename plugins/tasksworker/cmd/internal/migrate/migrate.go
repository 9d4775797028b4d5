// Package migrate is `host migrate`, which the host runs as
// `fp-plugin-tasks_worker migrate`: it runs the PostgreSQL broker's
// migrations. The DSN comes from -dsn, else the tasks_worker plugin's
// config in the host's config file (-config), else TASKHOST_DATABASE_URL.
package migrate

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/host"
	"github.com/taskhost/taskhost/plugins/tasksworker"
)

// Main runs `host migrate` with args (what follows "migrate") and returns
// its exit status: 0 done, 1 failed, 2 a usage error or no database.
func Main(args []string) int {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	path := configFlag(fs)
	dsn := fs.String("dsn", "", "PostgreSQL address (default: the tasks_worker config's dsn, then $"+tasksworker.DSNEnv+")")
	schema := fs.String("schema", "", "schema holding the tables (default: the config's schema, then public)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dsn == "" {
		if cfg, err := host.LoadConfig(*path); err == nil {
			if pc, ok := cfg.Plugin("tasks_worker"); ok {
				var tw struct {
					DSN    string `json:"dsn"`
					Schema string `json:"schema"`
				}
				_ = json.Unmarshal(pc.Config, &tw)
				*dsn = tw.DSN
				if *schema == "" {
					*schema = tw.Schema
				}
			}
		}
	}
	if *dsn == "" {
		*dsn = os.Getenv(tasksworker.DSNEnv)
	}
	if *dsn == "" {
		fmt.Fprintf(os.Stderr, "host migrate: no database: pass -dsn, set dsn in the tasks_worker config, or set %s\n", tasksworker.DSNEnv)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := postgres.Migrate(ctx, *dsn, *schema); err != nil {
		fmt.Fprintf(os.Stderr, "host migrate: %v\n", err)
		return 1
	}
	s := *schema
	if s == "" {
		s = "public"
	}
	fmt.Printf("migrated: schema %s is up to date\n", s)
	return 0
}

// configFlag is the host's -config flag, with the host's default.
func configFlag(fs *flag.FlagSet) *string {
	def := os.Getenv("TASKHOST_CONFIG")
	if def == "" {
		def = "taskhost.yaml"
	}
	return fs.String("config", def, "config file (env TASKHOST_CONFIG)")
}
