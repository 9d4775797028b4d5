-- 015: reports take fewer index entries.
--
-- A report is written once per attempt, beside the attempt's outcome, and
-- every index on tw_reports took an entry for it: seven with the primary
-- key, each a WAL record, about as much as a message's claim and ack
-- together. Two of them go:
--
-- tw_reports_ended (ended_at), read by PurgeReports alone, becomes a BRIN
-- index. Reports are appended about in the order they end, so a summary
-- of each range of pages finds the old ones as well, and an insert into a
-- range not summarized yet (the tail, where every new report lands) writes
-- nothing to it. VACUUM summarizes the ranges it finishes.
--
-- tw_reports_status (status, id) held every report, almost all of them
-- successes. It now holds the others only; ListReports of the success
-- status walks the primary key newest first, where most rows match. The
-- status goes into that statement as a literal (sqlstore), so the plan
-- knows which index serves it.
--
-- IF [NOT] EXISTS: a schema rolled back to an earlier version by hand runs
-- this again.
DROP INDEX IF EXISTS tw_reports_ended;
CREATE INDEX IF NOT EXISTS tw_reports_ended_brin ON tw_reports USING brin (ended_at);
DROP INDEX IF EXISTS tw_reports_status;
CREATE INDEX IF NOT EXISTS tw_reports_status_other ON tw_reports (status, id) WHERE status <> 'success';
