"""Passes over the graph IR: the op table (optable), the backward plan and ranks (passes),
exporter-output rewrites (rewrite), row bands (bands).

Layers, bottom up: paths, target, formats, graph, files, plan, prepare, boards, then the
command line (cli, docgen, plot); a module imports only from its own layer or below
(tests/project/test_layout.py)."""
