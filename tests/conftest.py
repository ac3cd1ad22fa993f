import pytest
import torch

from fxprop.engine import propagation as engine
from fxprop.testing import meta_devices_not_asked_for


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True, scope="session")
def _no_meta_device_leaks():
    """Every propagate of every test: no node's value is on ``meta`` unless the user asked for it
    (a meta input, meta parameters without ``param_device``, an explicit ``device="meta"``)."""
    commit = engine.Propagation.commit

    def checked_commit(self):
        commit(self)
        leaks = meta_devices_not_asked_for(self.gm, self.staged, self.default_device)
        assert not leaks, f"values on meta that the user did not ask for: {leaks}"

    engine.Propagation.commit = checked_commit
    yield
    engine.Propagation.commit = commit
