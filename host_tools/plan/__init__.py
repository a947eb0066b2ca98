"""Planning a run: the heap planner (memory) and the run's plan, what trains and its heap
(runplan).

Layers, bottom up: paths, target, formats, graph, files, plan, prepare, boards, then the
command line (cli, docgen, plot); a module imports only from its own layer or below
(tests/project/test_layout.py)."""
