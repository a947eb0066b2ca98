import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from host_tools.runner import find_micropython  # noqa: E402


def pytest_sessionstart(session):
    # In CI the MicroPython half of the suite must run, not quietly skip.
    if os.environ.get('CI') and not find_micropython():
        raise SystemExit('CI: no MicroPython binary ($MICROPYTHON, PATH, or beside python)')
