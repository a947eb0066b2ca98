"""Regenerate digits_tico_cnn.circle: a PyTorch CNN for the 8x8 digits, pre-trained in
PyTorch on the digits 0-5 only, converted with tico.  The demo (`python -m host_tools demo
--model cnn`) fine-tunes it on the board on all ten digits: the convolutional features
stay frozen (the BatchNorm is folded into the first conv by prepare) and the depthwise conv
and the classifier learn the new classes, a transfer-learning job.

    python datasets/digits/make_tico.py

Model (NCHW 1x8x8 in, logits out): Conv2d(1,8,3,p=1)-BatchNorm2d-ReLU-MaxPool2d(2)-
Conv2d(8,16,3,p=1,groups=8)-ReLU-MaxPool2d(2)-Flatten-Linear(64,10).  Exported in eval mode
(BatchNorm with its running statistics); tico writes it NCHW with TRANSPOSEs around the
NHWC kernels, which prepare cancels.
"""
import os

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
PRETRAIN_CLASSES = 6


def model():
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1, groups=8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64, 10))


def pretrain(m, x, y, epochs=30, seed=0, classes=PRETRAIN_CLASSES, shape=(1, 8, 8)):
    """Adam on the classes 0..classes-1 (the digits 0..PRETRAIN_CLASSES-1; train mode:
    BatchNorm learns its statistics), samples x reshaped to shape."""
    torch.manual_seed(seed)
    keep = y < classes
    xt = torch.from_numpy(x[keep].reshape(-1, *shape))
    yt = torch.from_numpy(y[keep].astype(np.int64))
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    lossf = nn.CrossEntropyLoss()
    m.train()
    for _ in range(epochs):
        perm = torch.randperm(len(xt))
        for s in range(0, len(xt), 32):
            i = perm[s:s + 32]
            opt.zero_grad()
            lossf(m(xt[i]), yt[i]).backward()
            opt.step()
    return m.eval()


def main():
    import tico
    z = np.load(os.path.join(HERE, 'digits.npz'))
    x, y = z['x'].astype(np.float32), z['y'].astype(np.int64)
    torch.manual_seed(0)
    m = pretrain(model(), x, y)
    with torch.no_grad():
        pred = m(torch.from_numpy(x.reshape(-1, 1, 8, 8))).argmax(1).numpy()
    seen = y < PRETRAIN_CLASSES
    print(f'PyTorch accuracy: digits 0-{PRETRAIN_CLASSES - 1} {np.mean(pred[seen] == y[seen]):.3f}, '
          f'all digits {np.mean(pred == y):.3f}')
    path = os.path.join(HERE, 'digits_tico_cnn.circle')
    tico.convert(m, (torch.zeros(1, 1, 8, 8),)).save(path)
    print(f'wrote {path}')


if __name__ == '__main__':
    main()
