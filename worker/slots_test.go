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

func TestSlotsExtraForOffloadedAttempts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		s     slots
		extra int
	}{
		{"no offload slots, nothing past the workers", slots{n: 8, mix: claimMix{8, 8}}, 0},
		{"before any claim, nothing past the workers", slots{n: 8, offSlots: 256}, 0},
		{"a claim of offloaded tasks alone asks for every free slot", slots{n: 8, offSlots: 256, mix: claimMix{8, 8}}, 256},
		{"a claim of in-process tasks alone asks for none", slots{n: 8, offSlots: 256, mix: claimMix{8, 0}}, 0},
		{"a mixed claim keeps the in-process part within the idle workers", slots{n: 8, offSlots: 256, mix: claimMix{8, 6}}, 24},
		{"the slots out are not free", slots{n: 8, inflight: 200, offloaded: 200, offSlots: 256, mix: claimMix{8, 8}}, 56},
		{"what an exchange in flight may claim past the workers is reserved", slots{n: 8, offSlots: 256, offReserved: 250, mix: claimMix{8, 8}}, 6},
		{"outcomes not yet written bound it at twice the slots", slots{n: 8, offSlots: 256, offloaded: 100, inflight: 100, pending: 400, mix: claimMix{8, 8}}, 12},
		{"a suspect blocks it", slots{n: 8, offSlots: 256, blocked: true, mix: claimMix{8, 8}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.s.extra(tc.s.free()); got != tc.extra {
				t.Errorf("extra = %d, want %d", got, tc.extra)
			}
		})
	}
}
