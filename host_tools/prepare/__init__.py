"""prepare and export: the pipeline of passes (pipeline), the prepared folder (runfolder),
int8 models (quant), choosing what trains (select), the int8 export's check
(exportcheck), evaluate (infer).

Layers, bottom up: paths, target, formats, graph, files, plan, prepare, boards, then the
command line (cli, docgen, plot); a module imports only from its own layer or below
(tests/project/test_layout.py)."""
