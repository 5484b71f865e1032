CREATE TABLE products (
    id          uuid PRIMARY KEY,
    name        text NOT NULL,
    price_cents bigint NOT NULL CHECK (price_cents > 0)
);

INSERT INTO products (id, name, price_cents) VALUES
    ('8f14e45f-ceea-4c9d-b2a5-0c1e3f4a9b21', 'Mechanical keyboard', 1299),
    ('c9f0f895-fb98-4b91-9f3a-2b7c5e1d0a44', 'Espresso machine', 64900),
    ('45c48cce-2e2d-4fbd-8a1e-7d3b9c6f5e12', 'Standing desk', 119900);

CREATE TABLE orders (
    id            uuid PRIMARY KEY,
    customer_id   text NOT NULL,
    status        text NOT NULL CHECK (status IN ('pending', 'confirmed', 'cancelled')),
    amount_cents  bigint NOT NULL CHECK (amount_cents > 0),
    cancel_reason text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE order_items (
    order_id         uuid NOT NULL REFERENCES orders (id),
    product_id       uuid NOT NULL REFERENCES products (id),
    quantity         integer NOT NULL CHECK (quantity > 0),
    unit_price_cents bigint NOT NULL,
    PRIMARY KEY (order_id, product_id)
);
