"""Where things are, for tests in any folder under tests/."""

import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
MODELS = os.path.join(REPO, "models")
DATA = os.path.join(TESTS, "data")
