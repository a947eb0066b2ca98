"""Fine-tune a keyword-spotting model to a new speaker, on the board, as int8.

The model is a Keras DS-CNN keyword spotter over 49x10 MFCC frames, 12 keywords,
converted to a full-integer int8 .tflite (bench/zoo/keras/dscnn_kws_int8.tflite; its
keywords are bench/zoo/pretrain_dscnn.py's synthetic time-frequency templates).  A new
speaker's voice sits one MFCC band higher: the model hears most of their keywords wrong.
utrain trains the int8 model as int8 on the board (integer forward pass, as TFLite
Micro runs it; --cache runs the frozen layers once per sample), from the speaker's own
recordings, and export writes an int8 .tflite again (docs/example-keywords.md).

    python examples/keywords.py [--fast] [--board rp2040]
"""
import os

import numpy as np

from common import args, train, export, evaluate, before_after, ROOT
from bench.zoo.pretrain_dscnn import data_kws

MODEL = os.path.join(ROOT, 'bench', 'zoo', 'keras', 'dscnn_kws_int8.tflite')


def speaker(x):
    """The new speaker: every frame's energy one MFCC band higher (a shorter vocal tract)."""
    return np.roll(x, 1, axis=2)


def main():
    a = args(__doc__, 'keywords', board='unix')
    n_train, n_test, epochs = (120, 120, 6) if a.fast else (300, 200, 12)
    x, y = data_kws(n_train + n_test, seed=11)
    x = speaker(x)
    np.savez(os.path.join(a.out, 'speaker.npz'), x=x[:n_train], y=y[:n_train])
    test = os.path.join(a.out, 'speaker_test.npz')
    np.savez(test, x=x[n_train:], y=y[n_train:])

    before = evaluate(MODEL, test)
    print(f'== on the board: fine-tune the classifier of {os.path.basename(MODEL)} (int8) on '
          f'{n_train} recordings of the new speaker')
    wof = train(MODEL, os.path.join(a.out, 'kws'), a, data=os.path.join(a.out, 'speaker.npz'),
                loss='scce', optimizer='adam', lr=0.005, batch=1, epochs=epochs,
                train='last:2', cache=True, shuffle=True, seed=0)
    tuned = os.path.join(a.out, 'kws_speaker.tflite')
    export(MODEL, wof, tuned)
    before_after(f'the new speaker\'s held-out keywords ({n_test})', before, evaluate(tuned, test))


if __name__ == '__main__':
    main()
