-- When payment-service answered the order's cancellation (payment.refunded or
-- payment.voided): guard 2 for a cancellation delivered again after its id left the
-- inbox. A refund or a tombstone already says so; a declined payment's answer
-- (payment.voided, nothing to refund) leaves no other mark on the row.
ALTER TABLE payments ADD COLUMN answered_at timestamptz;
UPDATE payments SET answered_at = coalesce(refunded_at, created_at)
 WHERE refund_id IS NOT NULL OR status = 'voided';
