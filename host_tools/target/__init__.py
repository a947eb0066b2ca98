"""The board's side as the host sees it: the board's code imported on the host (device),
the board profiles, micro/ staged and compiled, and the simulated board's run (runner).

Layers, bottom up: paths, target, formats, graph, files, plan, prepare, boards, then the
command line (cli, docgen, plot); a module imports only from its own layer or below
(tests/project/test_layout.py)."""
