package local

import (
	"errors"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// AcquireLock inserts lock name for the claim c unless it is held: held
// says whether c holds its message, ok whether c holds the lock now
// (taken now, or already held under c).
func (dialect) AcquireLock(c sqlstore.Conn, name, holder string, cl broker.Claim) (held, ok bool, err error) {
	var one int
	err = c.QueryRow(`SELECT 1 FROM tw_messages WHERE id = ? AND state = 'running' AND token = ?`,
		cl.ID, cl.Token).Scan(&one)
	if errors.Is(err, sqlstore.ErrNoRows) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	n, err := c.Exec(`INSERT INTO tw_locks (name, holder, message_id, token, acquired_at)
			VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING`, name, holder, cl.ID, cl.Token, sqlstore.Now)
	if err != nil || n == 1 {
		return true, n == 1, err
	}
	var id int64
	var token string
	if err := c.QueryRow(`SELECT message_id, token FROM tw_locks WHERE name = ?`, name).Scan(&id, &token); err != nil {
		return true, false, err
	}
	return true, id == cl.ID && token == cl.Token, nil
}
