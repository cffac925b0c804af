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


def deployment(root, partitions, spare, first_port):
    d = Deployment(root, partitions, spare, first_port)
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
    """2 partitions in service, 2 spare ones for the resharding, + 1 proxy."""
    yield from deployment(root, 2, 2, FIRST_PORT + 10)


@pytest.fixture(scope="module")
def two_plus_two_again(root):
    """Another 2 + 2 + 1, for a resharding that fails half-way."""
    yield from deployment(root, 2, 2, FIRST_PORT + 20)
