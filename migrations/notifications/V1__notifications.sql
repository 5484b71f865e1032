-- One notification per order: the customer hears about the saga's outcome exactly once.
CREATE TABLE notifications (
    order_id    uuid PRIMARY KEY,
    -- The terminal order event (order.confirmed or order.cancelled) this answers.
    event_id    text NOT NULL,
    customer_id text NOT NULL,
    outcome     text NOT NULL CHECK (outcome IN ('confirmed', 'cancelled')),
    message     text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
