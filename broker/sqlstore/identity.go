package sqlstore

import "context"

// StoreID returns the store's identity: a random id that its migration
// made once (local 0015, postgres 024) and that every process using the
// store reads alike, whatever its host. It names the store, not a
// process: see External.
func (s *Store) StoreID(ctx context.Context) (string, error) {
	return one(ctx, s, "store id", "the store's id (table tw_store)", func(r Row) (string, error) {
		var id string
		err := r.Scan(&id)
		return id, err
	}, `SELECT id FROM tw_store WHERE one`)
}
