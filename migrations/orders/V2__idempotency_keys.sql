-- The inbox of the HTTP API: one row per Idempotency-Key a client sent with a
-- POST /v1/orders that placed an order, written in the same transaction as the order and
-- its order.created outbox row. Either all three are committed or none is, so a retry
-- after a crash places the order, and a retry after the commit replays this response.
CREATE TABLE idempotency_keys (
    key             text PRIMARY KEY CHECK (length(key) BETWEEN 1 AND 255),
    -- SHA-256 of the method, the path and the parsed body with its keys sorted: the same
    -- key with another request is refused (422), not replayed.
    fingerprint     bytea NOT NULL,
    -- The order and the first answer. The request's transaction inserts the row first
    -- (the insert is its lock on the key) and fills these before it commits, so a
    -- committed row always has them.
    order_id        uuid REFERENCES orders (id),
    response_status smallint,
    -- The body exactly as it was first sent, byte for byte (jsonb would reorder it).
    response_body   text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((order_id IS NULL) = (response_status IS NULL)
           AND (response_status IS NULL) = (response_body IS NULL))
);

-- Expired keys are found (and, later, deleted) by age.
CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);
