import shutil
import sys
from pathlib import Path

import pytest

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from pgcluster import Deployment, temp_root  # noqa: E402


@pytest.fixture(scope="session")
def root():
    path = temp_root()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def deployment(root, partitions, spare, proxies=1):
    d = Deployment(root, partitions, spare, proxies=proxies)
    try:
        yield d
    finally:
        d.close()


@pytest.fixture(scope="module")
def four(root):
    """4 partitions + 1 proxy."""
    yield from deployment(root, 4, 0)


@pytest.fixture(scope="module")
def two_plus_two(root):
    """2 partitions in service, 2 spare ones for the resharding, + 2 proxies."""
    yield from deployment(root, 2, 2, proxies=2)


@pytest.fixture(scope="module")
def two_plus_two_checks(root):
    """Another 2 + 2 + 2 proxies, for the checks that refuse a resharding (nothing changes)."""
    yield from deployment(root, 2, 2, proxies=2)


@pytest.fixture
def fresh_two_plus_two(root):
    """A new 2 + 2 + 2 proxies for each test (a resharding that fails, then is repaired)."""
    yield from deployment(root, 2, 2, proxies=2)
