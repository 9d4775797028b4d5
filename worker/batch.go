package worker

// gather appends to batch what ch holds now, without waiting for more,
// until batch holds max items or ch is closed and empty. The completer's
// collectors and the ReportWriter batch with it: a lone item is never held
// back, and a busy channel gives large batches.
func gather[T any](ch <-chan T, batch []T, max int) []T {
	for len(batch) < max {
		select {
		case v, ok := <-ch:
			if !ok {
				return batch
			}
			batch = append(batch, v)
		default:
			return batch
		}
	}
	return batch
}
