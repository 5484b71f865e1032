-- Every charge the provider decided, succeeded or declined, as a card processor keeps
-- them: the reference is the merchant's (payment-service sends the order id), so the
-- charges made for one order can be listed and counted.
CREATE TABLE charges (
    id              text PRIMARY KEY,
    reference       text NOT NULL,
    amount_cents    bigint NOT NULL CHECK (amount_cents > 0),
    currency        text NOT NULL,
    status          text NOT NULL CHECK (status IN ('succeeded', 'failed')),
    failure_code    text,
    failure_message text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'failed') = (failure_code IS NOT NULL))
);

CREATE INDEX charges_reference ON charges (reference, created_at);

-- One row per Idempotency-Key, written in the same transaction as the charge it made and
-- holding the answer first sent: a retry with the key gets that answer again, and makes
-- no second charge. The same shape as order-service's keys.
CREATE TABLE idempotency_keys (
    key             text PRIMARY KEY CHECK (length(key) BETWEEN 1 AND 255),
    -- SHA-256 of the method, the path and the parsed body: the same key with another
    -- request is refused (422), not replayed.
    fingerprint     bytea NOT NULL,
    -- Claimed before the charge row is written (the claim is the lock two requests with
    -- one key queue on), so the charge's existence is checked at commit.
    charge_id       text NOT NULL REFERENCES charges (id) DEFERRABLE INITIALLY DEFERRED,
    response_status smallint NOT NULL,
    response_body   text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);
