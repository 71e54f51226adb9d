-- The agent-kernel log on PostgreSQL, schema version 4: the log's identity, a random id
-- made once with the log (or when an older log is first opened by a build that knows
-- version 4). Each machine's audit head file is named after it, so a log recreated at the
-- same URL is told apart from the one a head file vouches for.

ALTER TABLE agent_kernel_meta ADD COLUMN log_id TEXT;
UPDATE agent_kernel_meta SET log_id = gen_random_uuid()::text;
