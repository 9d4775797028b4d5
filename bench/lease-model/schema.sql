SET client_min_messages = warning;
-- The tables of the lease model (run.sh): one topic's messages, in the
-- floor model's layout (q, claimed row by row) and in the lease layout
-- (q2, claimed by id ranges recorded in leases).
DROP SCHEMA IF EXISTS lease_model CASCADE;
CREATE SCHEMA lease_model;
SET search_path = lease_model;
CREATE TABLE q (id bigserial PRIMARY KEY, topic text NOT NULL, task text NOT NULL, payload jsonb NOT NULL DEFAULT '{}',
  state text NOT NULL DEFAULT 'queued', attempts int NOT NULL DEFAULT 0, claimed_by text, claimed_at timestamptz,
  claim_token bigint, available_at timestamptz NOT NULL DEFAULT now(), created_at timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz);
CREATE INDEX q_running ON q (topic) WHERE state = 'running';
CREATE INDEX q_queued ON q (topic, available_at, id) WHERE state = 'queued';
CREATE SEQUENCE tok;
CREATE TABLE q2 (LIKE q INCLUDING DEFAULTS);
ALTER TABLE q2 ADD PRIMARY KEY (id);
CREATE INDEX q2_queued ON q2 (topic, id);
-- cursor: the last id leased; running: the messages leased and not acked
CREATE TABLE topics (name text PRIMARY KEY, lim int NOT NULL, cursor bigint NOT NULL DEFAULT 0, running int NOT NULL DEFAULT 0);
CREATE TABLE leases (topic text, lo bigint, hi bigint, n int, token bigint, worker text, at timestamptz, PRIMARY KEY (topic, lo));
CREATE TABLE done (topic text, lo bigint, hi bigint, at timestamptz);
INSERT INTO topics VALUES ('t', 100);
INSERT INTO q (topic, task, payload) SELECT 't', 'noop', '{"n": 1}' FROM generate_series(1, :n);
INSERT INTO q2 (id, topic, task, payload) SELECT i, 't', 'noop', '{"n": 1}' FROM generate_series(1, :n) i;
