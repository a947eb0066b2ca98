"""A confident model meeting the user's data: the loss takes the model's final SOFTMAX
(cce, scce) or LOGISTIC (bce) whole (utrain.model Net.fuse_head, losses.loss fused),
its logits' gradient p - t.  Through the op's own gradient, probabilities that round to
0 or 1 in float32 (a sigmoid is 1.0 from a logit of 17 on, a softmax's share 0 a gap of
about 104 below) multiplied the loss's gradient by 0: a model that was sure and wrong on
every sample never moved (issue 28: a Keras 1-D CNN from GitHub ending in Dense(1,
sigmoid), fine-tuned on new recordings: bce 7.38 for five epochs, not a weight changed)."""
import numpy as np
import pytest

from host_tools.formats.circle_build import CircleBuilder
from host_tools.prepare.pipeline import prepare
from host_tools.target import runner


def _model(path, head, scale, F=4, O=1):
    """Dense(O) at `scale` -> LOGISTIC or SOFTMAX: logits of about +-scale."""
    rng = np.random.default_rng(0)
    u = rng.standard_normal((O, F)).astype(np.float32)
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, F])
    z = b.tensor('z', [1, O])
    b.op('FULLY_CONNECTED', [x, b.tensor('w', [O, F], data=scale * u),
                             b.tensor('b', [O], data=np.zeros(O, np.float32))], [z])
    y = b.tensor('y', [1, O])
    b.op(head, [z], [y], **({'beta': 1.0} if head == 'SOFTMAX' else {}))
    b.inputs(x)
    b.outputs(y)
    b.save(path)
    return u


# (logits of 18-30: a float32 sigmoid of exactly 1.0 or 0.0; gaps of 60-400 between a
# softmax's classes: the true class's share under 1e-26; lr: the logits move lr x |x|^2
# a step, |x| = 1)
@pytest.mark.parametrize('head, scale, lr', [('LOGISTIC', 30.0, 0.5), ('SOFTMAX', 200.0, 2.0)])
def test_a_model_sure_and_wrong_on_every_sample_learns(tmp_path, head, scale, lr):
    F, O = 4, (1 if head == 'LOGISTIC' else 3)
    model = str(tmp_path / 'm.tflite')
    u = _model(model, head, scale, F, O)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((120, F)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    z = x @ u.T
    if head == 'LOGISTIC':      # the opposite of what the model says, sure of it
        keep = np.abs(z[:, 0]) > 0.6
        x, y = x[keep], (z[keep, 0] < 0).astype(np.float32)
    else:                       # the class it ranks lowest, by a gap of 100s
        top = np.sort(z, axis=1)
        keep = top[:, 1] - top[:, 0] > 0.3
        x, y = x[keep], np.argmin(z[keep], axis=1)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=x, y=y)
    out = str(tmp_path / 'o')
    s = prepare(model, out, data=data, test_split=0.25, lr=lr, epochs=10, log=lambda *a: None)
    assert s['settings']['loss'] == ('bce' if head == 'LOGISTIC' else 'scce') and \
        not s['settings']['from_logits'], s['settings']
    code, text = runner.run(out, python=True, stream=False)
    assert code == 0, text
    accs = [float(line.split('test_accuracy ')[1].split()[0]) for line in text.splitlines()
            if line.startswith('epoch ') and 'test_accuracy' in line]
    # (before: 0.00, every sample sure and wrong; through the op's gradient it stayed 0.00)
    assert 'before training: test_loss' in text and 'test_accuracy 0.0000' in text.split(
        'before training:')[1].splitlines()[0], text
    assert accs and accs[-1] >= 0.9, text
