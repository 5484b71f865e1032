-- Why payment-service could not refund a cancelled order's charge (payment.refund_failed):
-- the provider's refusal, or why no refund could be asked for. The order has settled all
-- the same (nothing is in flight; a person or an operator's retry is next), and shows
-- "refund": "failed" until a refund is recorded (refund_id), which clears nothing: the
-- failure stays as its history.
ALTER TABLE orders ADD COLUMN refund_failure text;
