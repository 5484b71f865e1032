-- The kinds are three pieces of news: an order's payment outcome (confirmed or
-- declined), its cancellation (by the customer or for taking too long), its refund.
-- A customer hears each piece once: a second outcome for an order (a contradicting event
-- typed by hand, say) finds the first and is told nothing, as before there were kinds.
ALTER TABLE notifications ADD COLUMN news text GENERATED ALWAYS AS (CASE
    WHEN kind IN ('confirmed', 'declined') THEN 'outcome'
    WHEN kind IN ('cancelled_by_customer', 'cancelled_for_timeout') THEN 'cancellation'
    ELSE 'refund'
END) STORED;
ALTER TABLE notifications DROP CONSTRAINT notifications_pkey;
ALTER TABLE notifications ADD PRIMARY KEY (order_id, news);
