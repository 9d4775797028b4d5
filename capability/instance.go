package capability

import (
	"os"
	"regexp"
	"strings"
)

// The host gives every plugin process it starts an instance id of its own
// (InstanceEnv), and tells it which earlier processes of the same plugin
// it saw end (EndedEnv). It is their parent: it waited on them, so those
// processes are certainly gone, a fact no heartbeat or pid lookup can
// give. A plugin that leaves records in shared storage under its process
// (tasks_worker's workers) names them with its instance id, so that the
// next process can take back at once what a dead one left.
const (
	// InstanceEnv holds this process's instance id: 16 lowercase hex
	// digits, random, never reused.
	InstanceEnv = "TASKHOST_PLUGIN_INSTANCE"
	// EndedEnv holds the instance ids of the earlier processes of this
	// plugin, under this host, that the host saw end, newest first,
	// separated by commas (at most MaxEndedInstances).
	EndedEnv = "TASKHOST_PLUGIN_ENDED"
)

// MaxEndedInstances bounds EndedEnv: the host keeps the newest ids.
const MaxEndedInstances = 8

var instanceID = regexp.MustCompile(`^[0-9a-f]{16}$`)

// ValidInstance reports whether id has the form of an instance id.
func ValidInstance(id string) bool { return instanceID.MatchString(id) }

// Instance returns this process's instance id, or "" when it was not
// started by a host that gives one (run by hand, or by an older host).
func Instance() string {
	if id := os.Getenv(InstanceEnv); ValidInstance(id) {
		return id
	}
	return ""
}

// EndedInstances returns the instance ids of this plugin's earlier
// processes that the host saw end, newest first; ids that are not of the
// form are left out.
func EndedInstances() []string {
	var out []string
	for _, id := range strings.Split(os.Getenv(EndedEnv), ",") {
		if ValidInstance(id) && len(out) < MaxEndedInstances {
			out = append(out, id)
		}
	}
	return out
}
