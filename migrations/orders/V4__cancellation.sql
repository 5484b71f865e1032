-- An order is settled once its outcome is decided and its cancellation, if it has one,
-- answered by payment-service (payment.refunded or payment.voided). Admission control
-- counts the unsettled orders as in flight: a cancelled order whose refund is still on
-- its way holds its place until the refund is recorded.
ALTER TABLE orders ADD COLUMN settled_at timestamptz;
-- The provider's id of the refund payment-service made for the order, once it reports it.
ALTER TABLE orders ADD COLUMN refund_id text;
-- Orders decided before cancellations existed have nothing left to answer.
UPDATE orders SET settled_at = updated_at WHERE status <> 'pending';

-- The count admission control takes several times a second, as orders_pending was: only
-- the rows it counts.
CREATE INDEX orders_unsettled ON orders (id) WHERE settled_at IS NULL;
DROP INDEX orders_pending;
-- The deadline's sweep finds the orders still pending past ORDER_PAYMENT_TIMEOUT, oldest
-- first, among the pending ones only.
CREATE INDEX orders_pending_since ON orders (created_at) WHERE status = 'pending';
