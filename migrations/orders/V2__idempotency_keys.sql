-- The inbox of the HTTP API: one row per Idempotency-Key a client sent with a
-- POST /v1/orders that placed an order, written in the same transaction as the order and
-- its order.created outbox row. Either all three are committed or none is, so a retry
-- after a crash places the order, and a retry after the commit replays this answer.
CREATE TABLE idempotency_keys (
    key             text PRIMARY KEY CHECK (length(key) BETWEEN 1 AND 255),
    -- SHA-256 of the method, the path and the parsed body with its keys sorted: the same
    -- key with another request is refused (422), not replayed.
    fingerprint     bytea NOT NULL,
    -- The key is claimed before the order row is written (the claim is the lock that
    -- makes two requests with one key queue up), so the order's existence is checked at
    -- commit.
    order_id        uuid NOT NULL REFERENCES orders (id) DEFERRABLE INITIALLY DEFERRED,
    response_status smallint NOT NULL,
    -- The body exactly as it was first sent, byte for byte (jsonb would reorder it).
    response_body   text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- Keys past their time to live are found (and deleted by the pruner) by age.
CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);
