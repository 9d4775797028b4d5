-- 0002: named leases with terms, for leader election (broker.Leaser): the
-- beat leader holds one, and its leader-only writes are fenced by the term.
-- expires_at is unix nanoseconds, as every time in this store.

CREATE TABLE tw_leases (
    name       TEXT    NOT NULL PRIMARY KEY,
    holder     TEXT    NOT NULL,
    term       INTEGER NOT NULL CHECK (term > 0),
    expires_at INTEGER NOT NULL
);
