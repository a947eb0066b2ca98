"""The files a run is made of and their checks: model.flat (flatmodel), .wof (wof),
train.tcfg (trainconfig), .ds samples (dataset), what prepare is handed (validate), the
frozen-prefix caches (prefixcache).

Layers, bottom up: paths, target, formats, graph, files, plan, prepare, boards, then the
command line (cli, docgen, plot); a module imports only from its own layer or below
(tests/project/test_layout.py)."""
