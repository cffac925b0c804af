-- The recipe's tables. The producer's side (orders, outbox) and the consumer's side (shipments,
-- stock) share one database here; in production they are usually two services with two databases,
-- each with the extension installed where its keys are written.
CREATE EXTENSION IF NOT EXISTS idempotency;

-- Producer: the business table and the transactional outbox, written in the same transaction as
-- the request's idempotency key.
CREATE TABLE orders (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer   text        NOT NULL,
    sku        text        NOT NULL,
    quantity   integer     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE outbox (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- publishing order
    message_id  uuid        NOT NULL UNIQUE DEFAULT gen_random_uuid(),  -- what consumers dedup on
    routing_key text        NOT NULL,
    payload     jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    sent_at     timestamptz  -- set by the relay after the broker confirmed the message
);
-- The relay only ever looks for unsent rows: a small partial index, not one over the whole table.
CREATE INDEX outbox_unsent ON outbox (id) WHERE sent_at IS NULL;
-- Sent rows are only history: delete them on a schedule (see README.md).
ALTER TABLE outbox SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.01);

-- Wake the relay when rows commit (it also polls, so a lost notification only delays).
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox', '');
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- Consumer: the effects of an "order created" event. Deliberately no unique constraint on
-- message_id: the dedup record in idem_keys is what keeps an event from being applied twice, and
-- the tests count rows here to prove it.
CREATE TABLE shipments (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id uuid        NOT NULL,
    order_id   bigint      NOT NULL,
    sku        text        NOT NULL,
    quantity   integer     NOT NULL CHECK (quantity > 0),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX shipments_message_id ON shipments (message_id);

CREATE TABLE stock (
    sku      text PRIMARY KEY,
    reserved bigint NOT NULL DEFAULT 0
);
