# ulab's a += u^T v (xnp.add_outer: batch 1's FC weight gradient, straight into the weights
# under plain SGD) for rows shorter than 256 values: blocks of r rows, each one broadcast
# product (r, 1) * (1, n) and one in-place add, a temporary of at most 512 values.  A ulab
# call costs thousands of cycles on a Cortex-M0+: a row at a time (4 calls a row), the
# digits MLP's update was 45% of its step on the emulated Pico.  Loaded only when used
# (code is heap).


def outer(a, u, v):
    # u (m,), v (n,): 1-D rows
    r = 512 // a.shape[1]
    u = u.reshape((u.shape[0], 1))
    v = v.reshape((1, v.shape[0]))
    for j in range(0, a.shape[0], r):
        b = a[j:j + r]
        b += u[j:j + r] * v
