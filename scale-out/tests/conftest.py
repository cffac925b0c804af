import itertools
import shutil
import sys
from pathlib import Path

import pytest

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from pgcluster import FIRST_PORT, Deployment, temp_root  # noqa: E402


@pytest.fixture(scope="session")
def root():
    path = temp_root()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def deployment(root, partitions, spare, first_port, proxies=1):
    d = Deployment(root, partitions, spare, first_port, proxies=proxies)
    try:
        yield d
    finally:
        d.close()


@pytest.fixture(scope="module")
def four(root):
    """4 partitions + 1 proxy."""
    yield from deployment(root, 4, 0, FIRST_PORT)


@pytest.fixture(scope="module")
def two_plus_two(root):
    """2 partitions in service, 2 spare ones for the resharding, + 2 proxies."""
    yield from deployment(root, 2, 2, FIRST_PORT + 10, proxies=2)


@pytest.fixture(scope="module")
def two_plus_two_checks(root):
    """Another 2 + 2 + 2 proxies, for the checks that refuse a resharding (nothing changes)."""
    yield from deployment(root, 2, 2, FIRST_PORT + 20, proxies=2)


@pytest.fixture
def fresh_two_plus_two(root):
    """A new 2 + 2 + 2 proxies for each test (a resharding that fails, then is repaired)."""
    port = FIRST_PORT + 30 + 10 * next(_fresh_ports)
    yield from deployment(root, 2, 2, port, proxies=2)


_fresh_ports = itertools.count()
