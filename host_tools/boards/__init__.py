"""Running on boards: real ones over mpremote (board), simulated (simboard), the emulated
Pico (pico), fleets on Flower (fleet).

Layers, bottom up: paths, target, formats, graph, files, plan, prepare, boards, then the
command line (cli, docgen, plot); a module imports only from its own layer or below
(tests/project/test_layout.py)."""
