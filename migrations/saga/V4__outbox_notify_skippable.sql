-- The relay's wake-up, skippable by a writer that wakes the relay itself.
--
-- A NOTIFYing transaction takes one lock for the whole server just before it commits and
-- holds it until the commit is flushed, so every transaction that wrote an outbox row, in
-- every database of the server, committed one after another. A writer in the process
-- whose relay is the active one wakes that relay in memory after its commit instead, and
-- says so with `SELECT set_config('saga.outbox_notify', 'off', true)` in its transaction
-- (local to it). Any other writer (another instance, psql) NOTIFYs as before.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('saga.outbox_notify', true), '') <> 'off' THEN
        PERFORM pg_notify('outbox', '');
    END IF;
    RETURN NULL;
END
$$;
