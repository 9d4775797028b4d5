-- 002: named leases with terms, for leader election (broker.Leaser): the
-- beat leader holds one, and its leader-only writes are fenced by the term.

CREATE TABLE tw_leases (
    name       text        PRIMARY KEY,
    holder     text        NOT NULL,
    term       bigint      NOT NULL CHECK (term > 0),
    expires_at timestamptz NOT NULL
);
