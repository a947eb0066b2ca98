# RESHAPE: a view of the input with the output's 2-D shape; its gradient is the
# reverse reshape.  No temporaries when the input is contiguous.
def forward(rt, op):
    x = rt.t[op[1][0]]
    s = rt.shape[op[2][0]]
    rt.t[op[2][0]] = x if x.shape == s else x.reshape(s)


def backward(rt, op, dy, flags):
    s = rt.shape[op[1][0]]
    rt.add_grad(op[1][0], dy if dy.shape == s else dy.reshape(s))
