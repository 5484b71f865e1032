-- The two tables every service of the saga shares the shape of.

-- The inbox: one row per event this service has applied. Guard 1 of every handler is an
-- INSERT here with ON CONFLICT DO NOTHING; zero rows inserted means "seen before".
CREATE TABLE processed_events (
    event_id     text PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);

-- The outbox: events written in the same transaction as the state change they announce,
-- published to Kafka afterwards by the relay. The unique event_id makes the database
-- refuse a second event with a deterministic id that already exists.
CREATE TABLE outbox (
    id           bigserial PRIMARY KEY,
    event_id     text NOT NULL UNIQUE,
    topic        text NOT NULL,
    key          text NOT NULL,
    type         text NOT NULL,
    payload      jsonb NOT NULL,
    occurred_at  timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);

-- The relay only ever reads the unpublished tail; keep that scan small however long the
-- published history grows.
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;

-- Wakes the relay as soon as a transaction with outbox rows commits (NOTIFY is delivered
-- on commit only). The relay still polls, so a lost notification only costs latency.
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_notify
    AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
