"""Runs upstream DataLoader test suites (PyTorch's test_dataloader.py, torchdata's
test_state_dict.py) against AsyncLoader. The upstream files are not part of this repository:
they are read at test time from $ASYNCLOADER_UPSTREAM (default: upstream/ beside the
repository); see conftest.py.

Importing this package installs the finder that loads them (as
``tests.stress.compat.upstream.<name>``)
with the loader names swapped, so that worker processes started with spawn or forkserver, which
import a test module again by name, get the same swap.
"""

from tests.stress.compat._upstream import install

install()
