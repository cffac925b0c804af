"""Concurrent clients of the proxy, for the tests."""

import json
import random
import threading
import time

import psycopg


class ClaimLog:
    """Every successful claim (scope, key, attempt, outcome) made by any client, thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.claims = []        # (scope, key, attempt) of outcome claimed
        self.outcomes = {}      # outcome -> count
        self.errors = {}        # sqlstate -> count
        self.completed = {}     # (scope, key) -> (attempt, response) acknowledged by idem_complete

    def outcome(self, scope, key, row):
        with self.lock:
            self.outcomes[row[0]] = self.outcomes.get(row[0], 0) + 1
            if row[0] == "claimed":
                self.claims.append((scope, key, row[2]))

    def calls(self):
        with self.lock:
            return sum(self.outcomes.values())

    def wait_for_calls(self, count, timeout=120):
        """True once the clients have made `count` claims in all, however slow the machine."""
        deadline = time.monotonic() + timeout
        while self.calls() < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.calls() >= count

    def error(self, error: psycopg.Error):
        with self.lock:
            self.errors[error.sqlstate] = self.errors.get(error.sqlstate, 0) + 1

    def double_claims(self):
        seen, doubles = set(), []
        for claim in self.claims:
            if claim in seen:
                doubles.append(claim)
            seen.add(claim)
        return doubles


def run_clients(count, body):
    """Start body(client_id, stop_event) in `count` threads; join() stops and waits for them."""
    stop = threading.Event()
    failures = []

    def run(client):
        try:
            body(client, stop)
        except Exception as e:  # a client that dies is a test failure, reported by the caller
            failures.append(repr(e))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    return stop, threads, failures


def join(stop, threads, timeout=120):
    stop.set()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
    return not any(t.is_alive() for t in threads)


def response(client, attempt):
    return json.dumps({"client": client, "attempt": attempt})


def rng(client):
    return random.Random(1000 + client)
