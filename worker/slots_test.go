package worker

import "testing"

func TestSlots(t *testing.T) {
	for _, tc := range []struct {
		name   string
		s      slots
		flying int
		idling bool
		free   int
		goes   bool
	}{
		{"an idle pool claims for every handler", slots{n: 8}, 0, false, 8, true},
		{"an idling pool with nothing to ack waits", slots{n: 8}, 0, true, 8, false},
		{"acks go out even while idling", slots{n: 8, pending: 2, acks: 2}, 0, true, 8, true},
		{"busy handlers are not claimed for", slots{n: 8, inflight: 5}, 0, false, 3, true},
		{"offloaded attempts hold no worker", slots{n: 8, inflight: 5, offloaded: 5}, 0, false, 8, true},
		{"what an exchange in flight may claim is reserved", slots{n: 8, reserved: 6}, 0, false, 2, true},
		{"outcomes not yet written bound the claim", slots{n: 8, pending: 14}, 0, false, 2, true},
		{"the acks about to go count as written", slots{n: 8, pending: 14, acks: 4}, 0, false, 6, true},
		{"a suspect blocks claiming", slots{n: 8, blocked: true}, 0, false, 0, false},
		{"a full pool claims nothing", slots{n: 8, inflight: 8, pending: 8}, 0, false, 0, false},
		{"a second exchange waits for a batch", slots{n: 8, inflight: 2, pending: 3, acks: 3}, 1, false, 6, false},
		{"half the pool's acks send a second exchange", slots{n: 8, inflight: 2, pending: 4, acks: 4}, 1, false, 6, true},
		{"a whole batch sends a second exchange", slots{n: 8, pending: 3, acks: 2, carried: 1}, 1, false, 8, true},
		{"acks held back for a busy claim keep the batch from being whole", slots{n: 8, pending: 3, acks: 2}, 1, false, 8, false},
		{"a second exchange waits while a suspect is held", slots{n: 8, pending: 4, acks: 4, blocked: true}, 1, false, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.s.free(); got != tc.free {
				t.Errorf("free = %d, want %d", got, tc.free)
			}
			if got := tc.s.launches(tc.flying, tc.idling); got != tc.goes {
				t.Errorf("launches = %v, want %v", got, tc.goes)
			}
		})
	}
}
