"""The torch front-end tests' shared fixture: each test starts and ends with Dynamo's
caches and autoclust's torch reports empty. Import it only after
`pytest.importorskip("torch")` (it imports torch)."""

import pytest
from autoclust.importers.torch import fx as torch_fx
from torch import _dynamo


@pytest.fixture(autouse=True)
def fresh_dynamo():
    _dynamo.reset()
    torch_fx.reset()
    yield
    _dynamo.reset()
