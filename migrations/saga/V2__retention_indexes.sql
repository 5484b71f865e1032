-- What the pruner (crates/saga/src/retention.rs) looks rows up by: each batch deletes the
-- oldest rows past their window, found through these indexes rather than by a scan of
-- the whole table.
CREATE INDEX processed_events_processed_at ON processed_events (processed_at);

-- Only published rows age out; the unpublished tail has its own index for the relay.
CREATE INDEX outbox_published_at ON outbox (published_at) WHERE published_at IS NOT NULL;
