-- The agent-kernel log on PostgreSQL, schema version 6 (the SQLite log's schema version 9):
-- no change to the tables. Writers of this version serialize on an advisory lock of their
-- own log (`write_lock`, derived from `agent_kernel_meta.log_id`) instead of one lock for
-- every log in the database; a build of version 5 or older, which takes the old lock, would
-- not be kept apart from them, so it must refuse the log as newer. Applied after version 5,
-- to a new log or to an older log when it is first opened by a build that knows version 6.
SELECT 1;
