"""Model files in and out: the graph IR (ir), circle and TFLite (circle_io, circle_build),
ONNX (onnx_io), the CIRCLE_TRAINING metadata (traininfo), reference models (refmodels).

Layers, bottom up: paths, target, formats, graph, files, plan, prepare, boards, then the
command line (cli, docgen, plot); a module imports only from its own layer or below
(tests/project/test_layout.py)."""
