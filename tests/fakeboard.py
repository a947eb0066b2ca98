"""The simulated serial board lives in host_tools/simboard.py (the fleet command runs
boards with it too); tests import it from here as before."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from host_tools.simboard import FakeBoard  # noqa: E402,F401
