-- A report may carry a key unique to its attempt (the claim token), so
-- that a writer retrying a batch whose commit it did not hear of stores
-- each report once. Older rows and reports without a key have NULL, which
-- the unique index lets repeat.
ALTER TABLE tw_reports ADD COLUMN report_key TEXT;

CREATE UNIQUE INDEX tw_reports_key ON tw_reports (report_key);
