-- Refunds, one per charge: a cancelled order gives its money back in full or in part,
-- once. The charge is UNIQUE so that a second refund of it, under any key, is refused by
-- the schema as well as by the code: the refund is the other thing the provider cannot
-- take back, and the key alone cannot guard it (a key expires, and a caller may lose
-- it).
CREATE TABLE refunds (
    id           text PRIMARY KEY,
    charge_id    text NOT NULL UNIQUE REFERENCES charges (id),
    amount_cents bigint NOT NULL CHECK (amount_cents > 0),
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- A refund's key keeps the charge it refunds in charge_id (so that column stays NOT NULL
-- and the charges' claim is unchanged) and the refund it made here: its replay answers
-- with the refund's Location. Claimed before the refund row is written, like charge_id,
-- so checked at commit.
ALTER TABLE idempotency_keys
    ADD COLUMN refund_id text REFERENCES refunds (id) DEFERRABLE INITIALLY DEFERRED;

-- The charges' claim, taking over an expired key, sets every column but this one, which
-- it does not know of: a key that made a refund and is taken over by a charge would
-- still name that refund. A refund's claim always names a new refund, so an update that
-- leaves refund_id as it was is a charge's, and the key forgets the refund.
CREATE FUNCTION idempotency_keys_forget_refund() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.refund_id := NULL;
    RETURN NEW;
END
$$;

CREATE TRIGGER idempotency_keys_taken_over_by_a_charge
    BEFORE UPDATE ON idempotency_keys
    FOR EACH ROW
    WHEN (OLD.refund_id IS NOT NULL AND NEW.refund_id IS NOT DISTINCT FROM OLD.refund_id)
    EXECUTE FUNCTION idempotency_keys_forget_refund();
