"""Regenerate the Keras-made .tflite files of the zoo (float32 and full-integer int8):
a small MLP, a DS-CNN keyword spotter (49x10 MFCC input), MobileNetV2-0.35 at 96x96 and
128x128 (keras.applications, weights=None: no download), an MCUNet/ProxylessNAS-like net
at 96x96 (inverted residuals with searched kernel sizes 3/5/7 and expansion ratios 3/4/6:
MCUNET_CFG, which mobilenet.py's PyTorch MCUNetLike shares) and `digits`,
MobileNetV2-0.35 96x96 pre-trained on the scikit-learn digits 0-4
(datasets/digits/digits.npz, 8x8 upscaled to 96x96x3; 12 epochs, held-out fifth 100 %
float and int8; bench/sparse.py fine-tunes it on the digits 5-9).  Each other model is
fitted briefly on seeded synthetic data (so BatchNorm statistics and weights are not just
their initialisation) and converted with the TFLite converter; the int8 files are
full-integer (int8 input and output, int8 weights and activations, int32 biases),
calibrated on the same data.  Beside them, `<name>_data.npz`: the first samples' labels
y, Keras's outputs keras_out (the parity reference) and, for the small inputs, the samples
x (the data functions here are numpy only: the bench regenerates the images).

tensorflow-cpu is not a requirement of utrain; run this in a venv of its own:

    python3 -m venv tfvenv && tfvenv/bin/pip install tensorflow-cpu==2.16.2 keras==3.3.3
    tfvenv/bin/python bench/zoo/make_keras.py [mlp dscnn mobilenetv2 mobilenetv2_128 mcunet digits
        mobilenetv2_128_digits mcunet_digits]

(digits takes about three minutes on two busy cores, the others less.)  The float files
over 1 MB (of mobilenetv2_128, mcunet, digits: .gitignore lists them) are not committed;
the float column of bench/sparse.py trains the int8 file dequantized (prepare
--dequantize): the same start as the int8 column.

(keras 3.3.3 is the Keras that tensorflow 2.16 was released with; the converter of 2.16
fails on models from newer Keras.  Models are exported as a SavedModel first, the path
the converter handles for Keras 3.)
"""
import os
import sys
import tempfile

import numpy as np

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'keras')


def data_mlp(n=256, seed=0):
    """16 features, 4 classes: Gaussian blobs around seeded centres."""
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((4, 16)) * 1.5
    y = rng.integers(0, 4, n)
    return (c[y] + rng.standard_normal((n, 16))).astype(np.float32), y


def data_kws(n=256, seed=1, classes=12):
    """49x10 'MFCC' frames: per class a seeded time-frequency template plus noise."""
    rng = np.random.default_rng(seed)
    t = rng.standard_normal((classes, 49, 10)).astype(np.float32)
    y = rng.integers(0, classes, n)
    x = t[y] + 0.7 * rng.standard_normal((n, 49, 10))
    return x[..., None].astype(np.float32), y


def data_image(n=32, seed=2, classes=10, size=96):
    """96x96x3 images in [-1, 1] (MobileNetV2's input range): a class-dependent colour
    gradient plus noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    g = np.linspace(-1, 1, size, dtype=np.float32)
    base = np.stack(np.meshgrid(g, g, indexing='ij'), -1)          # [size, size, 2]
    w = rng.standard_normal((classes, 2, 3)).astype(np.float32) * 0.5
    x = np.einsum('hwk,nkc->nhwc', base, w[y]) + 0.3 * rng.standard_normal((n, size, size, 3))
    return np.clip(x, -1, 1).astype(np.float32), y


DIGITS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      'datasets', 'digits', 'digits.npz')


def digits_images(x, size=96):
    """scikit-learn's 8x8 digits (pixels in [0, 1], [n, 64]) as size x size x 3 images in
    [-1, 1] (MobileNetV2's input range): each pixel a block (nearest neighbour), grey."""
    k = size // 8
    img = np.repeat(np.repeat(x.reshape(-1, 8, 8), k, 1), k, 2) * 2 - 1
    return np.repeat(img[..., None], 3, -1).astype(np.float32)


def digits_split(classes, seed=3, size=96):
    """The digits of these classes: (images size x size, labels), in a seeded order."""
    d = np.load(DIGITS)
    keep = np.isin(d['y'], classes)
    x, y = d['x'][keep], d['y'][keep]
    o = np.random.default_rng(seed).permutation(len(y))
    return digits_images(x[o], size), y[o]


PRETRAIN = (0, 1, 2, 3, 4)         # the digits the `digits` model is pre-trained on


def data_digits():
    """The pre-training data: the digits 0-4 (labels 0-4 of 10 outputs)."""
    return digits_split(PRETRAIN)


def mlp(keras):
    L = keras.layers
    return keras.Sequential([keras.Input((16,)), L.Dense(32, activation='relu'),
                             L.Dense(16, activation='relu'), L.Dense(4, activation='softmax')],
                            name='mlp')


def dscnn(keras, classes=12, ch=64):
    """ARM's DS-CNN-S keyword spotter (Hello Edge): conv 10x4 stride 2, four
    depthwise-separable blocks, average pool, dense."""
    L = keras.layers
    x = inp = keras.Input((49, 10, 1))
    x = L.Conv2D(ch, (10, 4), strides=(2, 2), padding='same', use_bias=False)(x)
    x = L.ReLU()(L.BatchNormalization()(x))
    for _ in range(4):
        x = L.DepthwiseConv2D(3, padding='same', use_bias=False)(x)
        x = L.ReLU()(L.BatchNormalization()(x))
        x = L.Conv2D(ch, 1, use_bias=False)(x)
        x = L.ReLU()(L.BatchNormalization()(x))
    x = L.GlobalAveragePooling2D()(x)
    x = L.Dense(classes, activation='softmax')(x)
    return keras.Model(inp, x, name='dscnn')


def mobilenetv2(keras, classes=10):
    return keras.applications.MobileNetV2(input_shape=(96, 96, 3), alpha=0.35, weights=None,
                                          classes=classes, classifier_activation='softmax')


def mobilenetv2_128(keras, classes=10):
    return keras.applications.MobileNetV2(input_shape=(128, 128, 3), alpha=0.35, weights=None,
                                          classes=classes, classifier_activation='softmax')


# (kernel, expansion, channels, stride) of the MCUNet/ProxylessNAS-like stack after a
# 3x3/2 conv to 16 channels (mobilenet.py's MCUNetLike builds the same in PyTorch)
MCUNET_CFG = [(3, 1, 8, 1), (7, 3, 16, 2), (3, 4, 16, 1), (5, 3, 24, 2), (7, 3, 24, 1),
              (5, 4, 40, 2), (3, 3, 40, 1), (5, 6, 48, 1), (7, 6, 96, 2), (3, 4, 96, 1),
              (5, 6, 160, 1)]


def mcunet(keras, classes=10, size=96):
    """Inverted residual blocks (1x1 expand, kxk depthwise, 1x1 project; BatchNorm, ReLU6;
    a residual add where the block keeps its shape), no wide head: the last block's 160
    channels feed the classifier."""
    L = keras.layers

    def cbr(x, ch, k=1, s=1, dw=False, act=True):
        c = (L.DepthwiseConv2D(k, s, padding='same', use_bias=False) if dw else
             L.Conv2D(ch, k, s, padding='same', use_bias=False))
        x = L.BatchNormalization()(c(x))
        return L.ReLU(6.0)(x) if act else x

    x = inp = keras.Input((size, size, 3))
    x, c = cbr(x, 16, 3, 2), 16
    for k, e, o, s in MCUNET_CFG:
        y = x if e == 1 else cbr(x, c * e)
        y = cbr(cbr(y, 0, k, s, dw=True), o, act=False)
        x, c = (L.Add()([x, y]) if s == 1 and c == o else y), o
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inp, L.Dense(classes, activation='softmax')(x), name='mcunet')


def digits(keras, build=None):
    """MobileNetV2-0.35 96x96 (or build's model) for the digits, BatchNorm momentum 0.9
    (keras.applications' 0.999 leaves the moving statistics near their initialisation
    after a short fit)."""
    m = (build or mobilenetv2)(keras)
    for layer in m.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.9
    return m


# name: (builder, data, epochs)
MODELS = {'mlp': (mlp, data_mlp, 20), 'dscnn': (dscnn, data_kws, 8),
          'mobilenetv2': (mobilenetv2, data_image, 2),
          'mobilenetv2_128': (mobilenetv2_128, lambda: data_image(size=128), 2),
          'mcunet': (mcunet, data_image, 2), 'digits': (digits, data_digits, 12),
          # the same pre-training for bench/sparse.py --model mbv2-128 / mcunet-96
          'mobilenetv2_128_digits': (lambda k: digits(k, mobilenetv2_128),
                                     lambda: digits_split(PRETRAIN, size=128), 12),
          'mcunet_digits': (lambda k: digits(k, mcunet), data_digits, 12)}
FILES = {'mlp': 'mlp', 'dscnn': 'dscnn_kws', 'mobilenetv2': 'mobilenetv2_035_96',
         'mobilenetv2_128': 'mobilenetv2_035_128', 'mcunet': 'mcunet_96',
         'digits': 'mobilenetv2_035_96_digits',
         'mobilenetv2_128_digits': 'mobilenetv2_035_128_digits', 'mcunet_digits': 'mcunet_96_digits'}


def convert(tf, saved, x=None):
    c = tf.lite.TFLiteConverter.from_saved_model(saved)
    if x is not None:
        c.optimizations = [tf.lite.Optimize.DEFAULT]
        c.representative_dataset = lambda: ([x[i:i + 1]] for i in range(len(x)))
        c.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        c.inference_input_type = tf.int8
        c.inference_output_type = tf.int8
    return c.convert()


def tflite_accuracy(tf, model, x, y):
    """Accuracy of a converted model (bytes) on x, y with TFLite's interpreter."""
    it = tf.lite.Interpreter(model_content=model)
    it.allocate_tensors()
    i, o = it.get_input_details()[0], it.get_output_details()[0]
    hit = 0
    for s, c in zip(x, y):
        if i['dtype'] == np.int8:
            sc, z = i['quantization']
            s = np.clip(np.round(s / sc) + z, -128, 127).astype(np.int8)
        it.set_tensor(i['index'], s[None])
        it.invoke()
        hit += int(it.get_tensor(o['index']).argmax() == c)
    return hit / len(y)


def make(name):
    import tensorflow as tf
    import keras
    build, data, epochs = MODELS[name]
    keras.utils.set_random_seed(0)
    x, y = data()
    held = None
    if name.endswith('digits'):     # a fifth held out: the pre-trained model's own accuracy
        k = len(y) * 4 // 5
        x, y, held = x[:k], y[:k], (x[k:], y[k:])
    m = build(keras)
    m.compile(optimizer=keras.optimizers.Adam(0.01 if held is None else 0.003),
              loss='sparse_categorical_crossentropy', metrics=['accuracy'])
    h = m.fit(x, y, batch_size=32, epochs=epochs, verbose=0, shuffle=held is not None)
    print(f'{name}: {m.count_params()} parameters, fit accuracy {h.history["accuracy"][-1]:.3f}')
    os.makedirs(HERE, exist_ok=True)
    stem = os.path.join(HERE, FILES[name])
    with tempfile.TemporaryDirectory() as d:
        m.export(d)
        for kind, rep in (('float', None), ('int8', x[:64])):
            b = convert(tf, d, rep)
            with open(f'{stem}_{kind}.tflite', 'wb') as f:
                f.write(b)
            print(f'  wrote {stem}_{kind}.tflite ({len(b)} bytes)')
            if held is not None:
                print(f'  {kind}: held-out accuracy {tflite_accuracy(tf, b, *held):.3f}')
    # Keras's own output on the first samples (the parity reference); x too when small
    # (the images are regenerated by data_image(), numpy only)
    k = min(len(x), 64 if x[0].size < 1024 else 8)
    extra = {'x': x[:k]} if x[:k].nbytes < 256 * 1024 else {}
    np.savez_compressed(f'{stem}_data.npz', y=y[:k].astype(np.int64),
                        keras_out=m.predict(x[:k], verbose=0).astype(np.float32), **extra)


if __name__ == '__main__':
    for n in sys.argv[1:] or list(MODELS):
        make(n)
