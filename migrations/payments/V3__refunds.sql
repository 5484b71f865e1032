-- A payment row is never deleted, so it is also where a cancellation leaves its mark:
-- 'voided' is the tombstone of an order cancelled before anything was charged. The
-- primary key then stops a later charge for the order (its order.created redriven after
-- the cancellation, say), as it stops a second one. The inbox could not: it is pruned.
ALTER TABLE payments DROP CONSTRAINT payments_status_check;
ALTER TABLE payments ADD CONSTRAINT payments_status_check
    CHECK (status IN ('succeeded', 'failed', 'voided'));

-- The order's refund: at most one, as the order has at most one charge. Made at the
-- provider under the key <order id>:refund, recorded here with payment.refunded in one
-- transaction.
ALTER TABLE payments ADD COLUMN refund_id text;
ALTER TABLE payments ADD COLUMN refunded_at timestamptz;
ALTER TABLE payments ADD CONSTRAINT payments_refund_needs_a_charge
    CHECK (refund_id IS NULL OR charge_id IS NOT NULL);
