-- One payment per order: the primary key is what makes a second charge impossible.
CREATE TABLE payments (
    order_id     uuid PRIMARY KEY,
    -- The order.created event this payment answers; its id derives the result's id.
    event_id     text NOT NULL,
    status       text NOT NULL CHECK (status IN ('succeeded', 'failed')),
    amount_cents bigint NOT NULL,
    reason       text,
    created_at   timestamptz NOT NULL DEFAULT now()
);
