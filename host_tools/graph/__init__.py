"""Passes over the graph IR: the op table (optable), the backward plan and ranks (passes),
exporter-output rewrites (rewrite runs them; edit holds the graph-editing primitives
beneath them all; qparams, shapes, transposes, biases, spellings, embeddings, groups,
inout, inscale, loops and copies the passes by theme), row bands (bands).

Layers, bottom up: paths, target, formats, graph, files, plan, prepare, boards, then the
command line (cli, docgen, plot); a module imports only from its own layer or below
(tests/project/test_layout.py)."""
