"""ONNX Runtime on-device training of one .onnx model, for bench/ort.py: run by the
onnxruntime-training environment's Python (not the project's), arguments in a JSON file:

    {"model": "m.onnx", "data": "d.npz", "out": "dir", "batch": 4, "epochs": 5, "lr": 0.05}

d.npz holds x_train, y_train, x_test, y_test (the samples utrain trains on, in its order).
Plain SGD, mean cross-entropy on logits, every initializer trains, batches in file order
(the last one smaller), as utrain's prepare --optimizer sgd --batch B --from-logits.
Prints one JSON line: per epoch the mean train loss over samples and the test accuracy,
the time per training sample (ms, train steps only); bench/ort.py reads its peak RSS."""
import json
import os
import sys
import time

import numpy as np


def main(arg_path):
    a = json.load(open(arg_path))
    import onnx
    import onnxruntime as ort
    from onnxruntime.training import artifacts
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    d = np.load(a['data'])
    xtr, ytr, xte, yte = d['x_train'], d['y_train'].astype(np.int64), d['x_test'], d['y_test']
    model = onnx.load(a['model'])
    params = [t.name for t in model.graph.initializer if t.data_type == 1]
    out = a['out']
    os.makedirs(out, exist_ok=True)
    artifacts.generate_artifacts(model, requires_grad=params, frozen_params=[],
                                 loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=out)
    state = CheckpointState.load_checkpoint(os.path.join(out, 'checkpoint'))
    module = Module(os.path.join(out, 'training_model.onnx'), state,
                    os.path.join(out, 'eval_model.onnx'))
    opt = Optimizer(os.path.join(out, 'optimizer_model.onnx'), module)
    opt.set_learning_rate(a['lr'])
    output = model.graph.output[0].name
    n, b = len(xtr), a['batch']
    losses, accs, train_s = [], [], 0.0
    for _ in range(a['epochs']):
        module.train()
        total = 0.0
        for s in range(0, n, b):
            xb, yb = xtr[s:s + b], ytr[s:s + b]
            t0 = time.perf_counter()
            loss = module(xb, yb)
            opt.step()
            module.lazy_reset_grad()
            train_s += time.perf_counter() - t0
            total += float(loss) * len(xb)
        losses.append(total / n)
        inf = os.path.join(out, 'inference.onnx')
        module.export_model_for_inferencing(inf, [output])
        sess = ort.InferenceSession(inf, providers=['CPUExecutionProvider'])
        iname = sess.get_inputs()[0].name
        pred = [int(np.argmax(sess.run(None, {iname: xte[i:i + 1]})[0])) for i in range(len(xte))]
        accs.append(float(np.mean(np.array(pred) == yte)))
    print(json.dumps({'loss': losses, 'acc': accs,
                      'ms': 1000.0 * train_s / (n * a['epochs']),
                      'version': ort.__version__}))


if __name__ == '__main__':
    main(sys.argv[1])
