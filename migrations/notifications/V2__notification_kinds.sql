-- One notification per order and kind: the customer hears once that the order was
-- confirmed (or its payment declined), once that it was cancelled, and once that its
-- charge was refunded, however often each event arrives. The kind replaces the outcome:
-- an order now has more to tell than its outcome.
ALTER TABLE notifications DROP CONSTRAINT notifications_outcome_check;
ALTER TABLE notifications RENAME COLUMN outcome TO kind;
UPDATE notifications SET kind = 'declined' WHERE kind = 'cancelled';
ALTER TABLE notifications ADD CONSTRAINT notifications_kind_check CHECK (kind IN (
    'confirmed', 'declined', 'cancelled_by_customer', 'cancelled_for_timeout', 'refunded'
));
ALTER TABLE notifications DROP CONSTRAINT notifications_pkey;
ALTER TABLE notifications ADD PRIMARY KEY (order_id, kind);
