package main

import "testing"

// TestConfigArg: the -config of `host migrate` is found as the flag
// package would read it.
func TestConfigArg(t *testing.T) {
	cases := []struct {
		args  []string
		want  string
		found bool
	}{
		{nil, "", false},
		{[]string{"-config", "a.yaml"}, "a.yaml", true},
		{[]string{"--config=a.yaml"}, "a.yaml", true},
		{[]string{"-dsn", "postgres://x", "-config", "a.yaml", "-schema", "s"}, "a.yaml", true},
		{[]string{"-config", "a.yaml", "-config=b.yaml"}, "b.yaml", true},
		{[]string{"-schema", "-config", "a.yaml"}, "", false}, // -config is -schema's value
		{[]string{"-dsn=x", "extra", "-config", "a.yaml"}, "", false},
		{[]string{"--", "-config", "a.yaml"}, "", false},
		{[]string{"-h", "-config", "a.yaml"}, "", false},
		{[]string{"-config"}, "", false},
	}
	for _, c := range cases {
		got, found := configArg(c.args)
		if got != c.want || found != c.found {
			t.Errorf("configArg(%q) = %q, %v; want %q, %v", c.args, got, found, c.want, c.found)
		}
	}
}
