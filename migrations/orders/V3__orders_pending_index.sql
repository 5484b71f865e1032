-- Admission control (crates/order-service/src/admission.rs) counts the orders in flight
-- several times a second: this index holds only those, so the count costs what the
-- backlog is, not what the table of every order ever placed is.
CREATE INDEX orders_pending ON orders (id) WHERE status = 'pending';
