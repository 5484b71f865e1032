-- Admission control's settle rate is the orders settled in the last few seconds, counted
-- by every copy of order-service from this one table: the whole saga's rate, however
-- many copies place its orders. This index holds the settled orders by when: the count
-- reads only the last few seconds' worth.
CREATE INDEX orders_settled_at ON orders (settled_at) WHERE settled_at IS NOT NULL;
