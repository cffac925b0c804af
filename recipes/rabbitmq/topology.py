"""The broker objects the relay and the consumer share, declared by both (declarations are
idempotent), and the connection settings both read from the environment."""

from __future__ import annotations

import os

import pika

EXCHANGE = "orders"
ROUTING_KEY = "order.created"
QUEUE = "shipping"
DEAD_LETTER_EXCHANGE = "orders.dead"
DEAD_LETTER_QUEUE = "shipping.dead"


def amqp_parameters() -> pika.URLParameters:
    """AMQP_URL, e.g. amqp://guest:guest@127.0.0.1:5672/%2F (the libpq variables PGHOST, PGPORT,
    PGDATABASE... name the database the same way)."""
    params = pika.URLParameters(os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"))
    # A dead broker must be noticed in seconds, not at TCP's pace.
    params.heartbeat = 10
    params.blocked_connection_timeout = 30
    params.connection_attempts = 1
    return params


def declare(channel: pika.adapters.blocking_connection.BlockingChannel) -> None:
    """Durable exchange and queue (they survive a broker restart; the messages survive it too
    because they are published persistent), and a dead-letter queue for poison messages."""
    channel.exchange_declare(DEAD_LETTER_EXCHANGE, exchange_type="fanout", durable=True)
    channel.queue_declare(DEAD_LETTER_QUEUE, durable=True)
    channel.queue_bind(DEAD_LETTER_QUEUE, DEAD_LETTER_EXCHANGE)
    channel.exchange_declare(EXCHANGE, exchange_type="direct", durable=True)
    channel.queue_declare(QUEUE, durable=True,
                          arguments={"x-dead-letter-exchange": DEAD_LETTER_EXCHANGE})
    channel.queue_bind(QUEUE, EXCHANGE, routing_key=ROUTING_KEY)
