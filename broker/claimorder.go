package broker

import "slices"

// ClaimOrder is the order in which a claim asks its topics, for the
// round-robin of the contract: topics without repeats or empty names,
// rotated to start at the topic turn designates (turn modulo their
// number). A store passes one more turn with each claim. It returns nil
// when no topic is left.
func ClaimOrder(topics []string, turn uint64) []string {
	var out []string
	for _, t := range topics {
		if t != "" && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	if len(out) == 0 {
		return nil
	}
	start := int(turn % uint64(len(out)))
	return append(out[start:], out[:start]...)
}
