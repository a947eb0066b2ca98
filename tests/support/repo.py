"""Where the checkout is, for the tests and their helpers (tests/conftest.py puts this
folder on sys.path; a helper run as a script finds it beside itself)."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MICRO = os.path.join(ROOT, 'micro')
