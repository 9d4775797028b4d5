package broker

import (
	"slices"
	"testing"
)

func TestClaimOrder(t *testing.T) {
	for _, c := range []struct {
		name   string
		topics []string
		turn   uint64
		want   []string
	}{
		{"no topics", nil, 3, nil},
		{"only empty names", []string{"", ""}, 0, nil},
		{"first turn starts at the first topic", []string{"a", "b", "c"}, 0, []string{"a", "b", "c"}},
		{"each turn starts one later", []string{"a", "b", "c"}, 1, []string{"b", "c", "a"}},
		{"turns wrap around", []string{"a", "b", "c"}, 5, []string{"c", "a", "b"}},
		{"repeats and empty names are left out", []string{"a", "", "b", "a", "b"}, 1, []string{"b", "a"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := ClaimOrder(c.topics, c.turn); !slices.Equal(got, c.want) {
				t.Fatalf("ClaimOrder(%q, %d) = %q, want %q", c.topics, c.turn, got, c.want)
			}
		})
	}
}
