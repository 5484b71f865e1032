-- Intent before effect. A payment row is written, and committed, before the provider is
-- asked for anything: 'charging' names the charge about to be asked for and its key, so
-- no charge can stand at the provider that no row here knows of, whatever stops the
-- caller after the call. A call whose answer never came (a timeout, a cut connection, a
-- 5xx) leaves it 'unknown': the charge may or may not have been made. Only the same
-- request under the same key tells which; an empty list of the order's charges never
-- does, as a charge still committing at the provider is not in it.
ALTER TABLE payments DROP CONSTRAINT payments_status_check;
ALTER TABLE payments ADD CONSTRAINT payments_status_check
    CHECK (status IN ('charging', 'unknown', 'succeeded', 'failed', 'voided'));
-- The charge's idempotency key, as the intent named it; null on payments from before.
ALTER TABLE payments ADD COLUMN charge_key text;

-- The refund's own intent and ending, beside the charge's:
--   refunding  the refund is about to be asked for, under refund_key;
--   unknown    it was asked for, and no answer came;
--   refunded   refund_id holds it;
--   failed     the provider refused it (refund_reason says why); an operator may try
--              again, under a new key (refund_attempt counts them);
--   manual     no refund can be asked for (a payment with no charge id, a charge that
--              could not be resolved): a person must settle it, refund_reason says why.
ALTER TABLE payments ADD COLUMN refund_status text
    CHECK (refund_status IN ('refunding', 'unknown', 'refunded', 'failed', 'manual'));
ALTER TABLE payments ADD COLUMN refund_key text;
ALTER TABLE payments ADD COLUMN refund_attempt integer NOT NULL DEFAULT 0;
ALTER TABLE payments ADD COLUMN refund_reason text;
-- When the charge's or the refund's state last changed: how long an attempt has been
-- unknown, against the provider's key lifetime.
ALTER TABLE payments ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now();
UPDATE payments SET refund_status = 'refunded', refund_attempt = 1,
                    updated_at = coalesce(refunded_at, created_at)
 WHERE refund_id IS NOT NULL;
ALTER TABLE payments ADD CONSTRAINT payments_refunded_has_its_refund
    CHECK ((refund_status IS NOT DISTINCT FROM 'refunded') = (refund_id IS NOT NULL));

-- The payments not at rest: what the settlement gauges count, a few times a minute.
CREATE INDEX payments_unsettled ON payments (updated_at)
 WHERE status IN ('charging', 'unknown')
    OR refund_status IN ('refunding', 'unknown', 'failed', 'manual');
