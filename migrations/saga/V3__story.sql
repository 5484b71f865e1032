-- What an order's story (sagactl) needs that the saga did not record: which copy of an
-- event claimed its id, and which event each outbox row answers.

-- Guard 1 writes where it read the event that claimed the id. Every other copy of that id
-- (a redelivery, a hand-replayed record) met guard 1 and left no trace; with this the
-- story tells the one that claimed it from those that bounced, even when they sit on
-- different partitions. NULL for an id claimed by an event built in code.
ALTER TABLE processed_events
    ADD COLUMN topic        text,
    ADD COLUMN partition    integer,
    ADD COLUMN kafka_offset bigint;

-- The event whose handling wrote this row (its causation id; NULL for one an HTTP request
-- wrote). A claimed event with an outbox row caused by it was applied; one without was
-- stopped by guard 2. The relay sends it as the record's `causation_id` header.
ALTER TABLE outbox ADD COLUMN caused_by text;
