package tasksworker

import "testing"

func TestDuplicateKey(t *testing.T) {
	for in, want := range map[string]string{
		`{}`:                               "",
		`{"a": 1, "b": {"a": 2}}`:          "",
		`[{"a": 1}, {"a": 2}]`:             "",
		`{"a": [1, {"b": [], "c": {}}]}`:   "",
		`{"a": 1, "a": 1}`:                 "a",
		`{"x": {"y": [{"z": 1, "z": 2}]}}`: "x.y[].z",
		`{"x": {}, "y": 1, "y": 2}`:        "y",
		`"a"`:                              "",
	} {
		if got := duplicateKey([]byte(in)); got != want {
			t.Errorf("duplicateKey(%s) = %q, want %q", in, got, want)
		}
	}
}
