import os
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
# The checkout (host_tools), the helpers (tests/support) and every topic folder, so that a
# test imports a helper or another folder's test module (test_parity...) by its bare name,
# whichever file pytest is given.  No test file needs a sys.path line for these.
for _p in sorted(os.path.join(TESTS, d) for d in os.listdir(TESTS)
                 if os.path.isdir(os.path.join(TESTS, d)) and not d.startswith(('.', '_'))):
    if _p not in sys.path:
        sys.path.insert(0, _p)
if os.path.dirname(TESTS) not in sys.path:
    sys.path.insert(0, os.path.dirname(TESTS))

from host_tools.target.runner import find_micropython  # noqa: E402

# A --select trial that raises (a bug, not a refusal or a divergence) stops prepare here,
# naming the trial (host_tools/prepare/select.py strict()), in this process and the ones
# it starts; a user's prepare says so and goes on
os.environ.setdefault('UTRAIN_STRICT_TRIALS', '1')


def pytest_sessionstart(session):
    # In CI the MicroPython half of the suite must run, not quietly skip.
    if os.environ.get('CI') and not find_micropython():
        raise SystemExit('CI: no MicroPython binary ($MICROPYTHON, PATH, or beside python)')
    # The device code's gc.collect() as host_tools runs it (host_tools.target.device.
    # light_gc) in the tests that build device objects themselves (Q8Net, Trainer): a full
    # collection of a pytest worker holding torch takes 0.25 s, most of such a test's time
    from host_tools.target.device import light_gc
    session.config._light_gc = light_gc()
    session.config._light_gc.__enter__()


def pytest_sessionfinish(session):
    held = getattr(session.config, '_light_gc', None)
    if held is not None:
        held.__exit__(None, None, None)
