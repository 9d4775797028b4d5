-- 021: the batches of tw_done compress with lz4 and stay in their row.
--
-- A batch's messages (a tw_done_message[] of 40 to 100 elements, 6 to 12 kB)
-- were compressed with pglz, the most expensive step of an ack after the
-- delete. lz4 compresses the same array in about a third of the time but
-- to a little more than 2 kB, over the TOAST threshold, so with the
-- column's default storage (EXTENDED) the value went out of line into
-- the TOAST table: a row and an index entry more per chunk. With storage
-- MAIN the compressed value stays in the row unless the row could not fit
-- in a page any other way.
--
-- A server built without lz4, or older than PostgreSQL 14, keeps pglz
-- (the ALTER fails, the migration goes on); MAIN applies either way.
-- Values written before keep their compression: both read back the same.
-- Both ALTERs change the catalog only; nothing is rewritten.
ALTER TABLE tw_done ALTER COLUMN messages SET STORAGE MAIN;
DO $$
BEGIN
    EXECUTE 'ALTER TABLE tw_done ALTER COLUMN messages SET COMPRESSION lz4';
EXCEPTION WHEN feature_not_supported OR syntax_error THEN
    RAISE NOTICE 'tw_done.messages keeps pglz: this server has no lz4';
END
$$;
