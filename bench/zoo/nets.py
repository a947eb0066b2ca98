"""The PyTorch architectures of the zoo (issue 15), defined here (torchvision's wheel cannot
load its C ops beside CPU torch) and converted with tico.  Each is what people deploy on
microcontrollers, at the size they deploy it:

  dscnn     DS-CNN keyword spotting (Hello Edge, DS-CNN-S): MFCC 49x10, conv 10x4/2 (64),
            four depthwise-separable blocks, average pool, 12 classes; BatchNorm
  imu       1-D conv net for 6-axis IMU windows (128 samples): three conv-BN-ReLU
            blocks (1xk kernels) with max pooling, global average pool, 6 activities
  resnet8   MLPerf Tiny's ResNet-8 (CIFAR-10, 32x32x3): three residual stages (16, 32,
            64 channels, 1x1 conv shortcuts), residual adds, BatchNorm
  lstm      LSTM keyword model: 20 MFCC frames of 10, hidden 32, final state h_n -> 12 classes
  gru       the same with a GRU
  lnblock   a small transformer-style token MLP: 8 tokens of 16, Linear-LayerNorm-GELU-
            Linear with a residual, LayerNorm, mean over tokens, 4 classes

Weights are PyTorch's default initialisation (seeded); BatchNorm statistics and affine
parameters, and LayerNorm's, are set to seeded non-trivial values (an untrained model
exported with unit statistics would hide a wrong BatchNorm fold).  The models are
exported in eval mode (tico refuses train-mode BatchNorm).
"""
from __future__ import annotations

import torch
from torch import nn


def _randomise_norms(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                c = m.num_features
                m.running_mean.copy_((torch.rand(c, generator=g) - 0.5) * 0.2)
                m.running_var.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
                m.bias.copy_((torch.rand(c, generator=g) - 0.5) * 0.2)
            elif isinstance(m, nn.LayerNorm):
                c = m.normalized_shape[0]
                m.weight.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
                m.bias.copy_((torch.rand(c, generator=g) - 0.5) * 0.2)
    return model.eval()


def _cbr(i, o, k, s=1, p=0, groups=1):
    return [nn.Conv2d(i, o, k, s, p, groups=groups, bias=False), nn.BatchNorm2d(o), nn.ReLU()]


class DSCNN(nn.Sequential):
    def __init__(self, classes=12, ch=64):
        layers = _cbr(1, ch, (10, 4), 2, (4, 1))
        for _ in range(4):
            layers += _cbr(ch, ch, 3, 1, 1, groups=ch) + _cbr(ch, ch, 1)
        super().__init__(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(ch, classes))


class IMUNet(nn.Sequential):
    """The 1-D convolutions written as Conv2d with 1xk kernels over a [6, 1, 128] input
    (how TFLite deploys them too): tico 0.1 fails to export Conv1d followed by
    BatchNorm1d (a broadcasting error inside its export)."""

    def __init__(self, classes=6):
        def blk(i, o, k):
            return _cbr(i, o, (1, k), 1, (0, k // 2))
        super().__init__(*blk(6, 16, 5), nn.MaxPool2d((1, 2)), *blk(16, 32, 5),
                         nn.MaxPool2d((1, 2)), *blk(32, 32, 3), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(32, classes))


class Residual(nn.Module):
    def __init__(self, i, o, s):
        super().__init__()
        self.a = nn.Sequential(*_cbr(i, o, 3, s, 1))
        self.b = nn.Sequential(nn.Conv2d(o, o, 3, 1, 1, bias=False), nn.BatchNorm2d(o))
        self.short = nn.Conv2d(i, o, 1, s) if (i, s) != (o, 1) else nn.Identity()

    def forward(self, x):
        return torch.relu(self.b(self.a(x)) + self.short(x))


class ResNet8(nn.Sequential):
    def __init__(self, classes=10):
        super().__init__(*_cbr(3, 16, 3, 1, 1), Residual(16, 16, 1), Residual(16, 32, 2),
                         Residual(32, 64, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, classes))


class RNNKWS(nn.Module):
    """cell(10, hidden) over the frames; the last step's state -> Linear."""

    def __init__(self, cell, feat=10, hidden=32, classes=12):
        super().__init__()
        self.rnn = cell(feat, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x):
        _, h = self.rnn(x)               # the final hidden state h_n
        if isinstance(h, tuple):         # LSTM: (h_n, c_n)
            h = h[0]
        return self.fc(h[0])


class LNBlock(nn.Module):
    def __init__(self, dim=16, hidden=32, classes=4):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.ln1 = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):                 # x [1, tokens, dim]
        h = self.fc2(nn.functional.gelu(self.ln1(self.fc1(x)))) + x
        return self.head(self.ln2(h).mean(1))


# name -> (builder, input shape (NCHW / NCL / NLC as PyTorch takes it), classes)
NETS = {
    'dscnn': (lambda: DSCNN(), (1, 1, 49, 10), 12),
    'imu': (lambda: IMUNet(), (1, 6, 1, 128), 6),
    'resnet8': (lambda: ResNet8(), (1, 3, 32, 32), 10),
    'lstm': (lambda: RNNKWS(nn.LSTM), (1, 20, 10), 12),
    'gru': (lambda: RNNKWS(nn.GRU), (1, 20, 10), 12),
    'lnblock': (lambda: LNBlock(), (1, 8, 16), 4),
}


def build(name, seed=0):
    """(eval-mode PyTorch model, input shape, classes), seeded."""
    make, shape, classes = NETS[name]
    torch.manual_seed(seed)
    return _randomise_norms(make(), seed + 1), shape, classes


def export(name, path, seed=0):
    """Convert the zoo model with tico to a circle file at path; returns (model, shape,
    classes)."""
    import tico
    m, shape, classes = build(name, seed)
    tico.convert(m, (torch.zeros(shape),)).save(path)
    return m, shape, classes
