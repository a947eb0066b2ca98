"""The simulated serial board lives in host_tools/boards/simboard.py (the fleet command runs
boards with it too); tests import it from here as before."""


from host_tools.boards.simboard import FakeBoard  # noqa: E402,F401
