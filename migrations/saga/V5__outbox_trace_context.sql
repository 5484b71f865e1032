-- The W3C trace context an outbox row was written in (saga::trace): the relay's send
-- span continues it, and puts its own on the record's headers. NULL when traces are off.
ALTER TABLE outbox
    ADD COLUMN traceparent text,
    ADD COLUMN tracestate text;
