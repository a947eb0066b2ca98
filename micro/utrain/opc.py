# The op contract: circle builtin opcodes, the option-float slots of each op and the
# backward flags, shared by the device kernels (op_*.py), the model reader (flat.py) and
# the host (host_tools/graph/optable.py writes the options by these slots; docs/flat-model.md
# lists them; tests/ops/test_contract.py checks that all three agree).
# A board never imports it: MicroPython folds const() only within a module, and this
# module's public names would cost ~6 KB of heap while loaded.  The device modules
# carry the values they use as private consts (_NAME = const(v), folded at compile
# time, no heap), which tests/ops/test_contract.py checks against this file.
# Adding an op: docs/flat-model.md.
try:
    from micropython import const
except ImportError:             # the host (CPython)
    def const(x):
        return x

# ---- circle builtin opcodes the device runs
ADD = const(0)
AVERAGE_POOL_2D = const(1)
CONCATENATION = const(2)
CONV_2D = const(3)
DEPTHWISE_CONV_2D = const(4)
FULLY_CONNECTED = const(9)
LOGISTIC = const(14)
MAX_POOL_2D = const(17)
MUL = const(18)
RELU = const(19)
RELU_N1_TO_1 = const(20)
RELU6 = const(21)
RESHAPE = const(22)
SOFTMAX = const(25)
TANH = const(28)
PAD = const(34)
TRANSPOSE = const(39)
MEAN = const(40)
SUB = const(41)
DIV = const(42)
SQUEEZE = const(43)
STRIDED_SLICE = const(45)
EXPAND_DIMS = const(70)
LEAKY_RELU = const(98)
ELU = const(111)
HARD_SWISH = const(117)
SPLIT = const(49)
SPLIT_V = const(102)
SQRT = const(75)
RSQRT = const(76)
EXP = const(47)
LOG = const(73)
GELU = const(150)
ROUND = const(116)
FLOOR = const(8)
CEIL = const(104)
SIGN = const(158)
BATCH_MATMUL = const(126)
TRANSPOSE_CONV = const(67)
GATHER = const(36)
RESIZE_BILINEAR = const(23)
RESIZE_NEAREST_NEIGHBOR = const(97)
LESS = const(58)
GREATER = const(61)
GREATER_EQUAL = const(62)
LESS_EQUAL = const(63)
EQUAL = const(71)
NOT_EQUAL = const(72)
SELECT = const(64)
SELECT_V2 = const(123)

# ---- backward flags (a backward entry's u16): DX the first data input's gradient, DW
# the weight's, DB the bias's.  Data input n >= 1 has bit DXN << n in the host's plan;
# the file flags its tensor GRAD instead (utrain.flat: net.gin), for any n
DX = const(1)
DW = const(2)
DB = const(4)
DXN = const(4)

# ---- fused activation codes (circle's ActivationFunctionType; LOGISTIC is utrain's)
AF_NONE = const(0)
AF_RELU = const(1)
AF_RELU_N1_TO_1 = const(2)
AF_RELU6 = const(3)
AF_TANH = const(4)
AF_LOGISTIC = const(6)

# ---- option slots
# SPLIT, SPLIT_V: S_COLS 1 splits the device columns (the last axis), else the rows seen
# as [S_OUTER, axis, S_INNER]; the n + 1 part boundaries along the axis from S_B0 on
S_COLS = const(0)
S_OUTER = const(1)
S_INNER = const(2)
S_B0 = const(3)
# GELU: the tanh approximation (1) or the erf form (0)
APPROX = const(0)
# FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D, the pools, ADD/SUB/MUL/DIV: the fused
# activation (op_act's codes); SOFTMAX: beta; LEAKY_RELU: alpha
ACT = const(0)
BETA = const(0)
ALPHA = const(0)
# CONV_2D, DEPTHWISE_CONV_2D, MAX_POOL_2D, AVERAGE_POOL_2D (after ACT): input H, W, C,
# output OH, OW, OC, kernel KH, KW, stride SH, SW, dilation DH, DW, pad top, pad left;
# DEPTHWISE_CONV_2D adds the depth multiplier.  TRANSPOSE_CONV: the same slots of the
# convolution whose input gradient it is (H, W, C its output's; OH, OW, OC its input's)
G_H = const(1)
G_W = const(2)
G_C = const(3)
G_OH = const(4)
G_OW = const(5)
G_OC = const(6)
G_KH = const(7)
G_KW = const(8)
G_SH = const(9)
G_SW = const(10)
G_DH = const(11)
G_DW = const(12)
G_PT = const(13)
G_PL = const(14)
G_MULT = const(15)
# MEAN: the input seen as [outer, red, inner], the output [outer, inner]
M_OUTER = const(0)
M_RED = const(1)
M_INNER = const(2)
# ADD/SUB/MUL/DIV (after ACT): the constant (maybe trainable) operand's position or -1;
# the output's rows as N0 x N1 blocks of N2 rows; per operand s, at E_OPD*s on from
# E_D0: block (i, j) starts at its row i*D0 + j*D1 and has E_ROWS rows (1: broadcast)
E_PARAM = const(1)
E_N0 = const(2)
E_N1 = const(3)
E_N2 = const(4)
E_D0 = const(5)
E_D1 = const(6)
E_ROWS = const(7)
E_OPD = const(3)
# BATCH_MATMUL: ADJ (1: adj_x, the first operand's matrices transposed; 2: adj_y, the
# second's), then E_PARAM, E_N0, E_N1 (the output's batch of matrices as N0 x N1
# blocks), E_N2 (its rows per matrix) and per operand E_D0, E_D1, E_ROWS as ADD's
ADJ = const(0)
# GATHER (an embedding): the table's rows, and 1 where an index in -N..-1 reads row
# index + N (Keras's Embedding, ONNX Gather), 0 where it is out of range (TFLite GATHER)
GA_N = const(0)
GA_WRAP = const(1)
# RESIZE_BILINEAR, RESIZE_NEAREST_NEIGHBOR: the input's H, W, the output's OH, OW, then
# from R_T the (lo, hi, f) of each output row, then of each output column
R_H = const(0)
R_W = const(1)
R_OH = const(2)
R_OW = const(3)
R_T = const(4)
# PAD, TRANSPOSE, STRIDED_SLICE, CONCATENATION: per device input j, at C_PART*j, a
# block copy: NA x NB blocks of N1 x N2, TR (input block transposed), then side A (the
# input) at C_A and side B (the output) at C_B, C_SIDE floats each: start row, start
# col, row and col step per outer i, the same per j, row step and col step in a block
C_NA = const(0)
C_NB = const(1)
C_N1 = const(2)
C_N2 = const(3)
C_TR = const(4)
C_A = const(5)
C_B = const(13)
C_SIDE = const(8)
C_PART = const(21)
