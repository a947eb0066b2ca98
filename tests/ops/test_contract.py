"""The op contract agrees with itself: its names (micro/utrain/opc.py), the device's
copies of them and kernel table (flat.KERNELS), the host's rows (host_tools/graph/optable.py)
and the layout page (docs/flat-model.md); the kernels read options and dispatch only by
those names."""
import os
import re

import pytest

from host_tools.target.device import module
from host_tools.graph.optable import SPECS

from repo import ROOT  # noqa: E402
DOC = os.path.join(ROOT, 'docs', 'flat-model.md')
MICRO = os.path.join(ROOT, 'micro', 'utrain')
opc = module('opc')
KERNELS = module('flat').KERNELS


def _doc():
    with open(DOC) as f:
        return f.read()


def test_host_rows_and_device_table_name_the_same_ops():
    assert {s.code for s in SPECS.values()} == set(KERNELS)
    assert len({s.code for s in SPECS.values()}) == len(SPECS)          # no code twice
    for name, s in SPECS.items():
        assert s.code == getattr(opc, name)
        m = module(s.kernel)
        assert callable(m.forward) and callable(m.backward), s.kernel
        # op_conv sums its weight gradient whole (asks the sink for a whole array): the
        # planner must count it so; a 'rows' kernel never does
        if getattr(m, 'WGRAD_WHOLE', False):
            assert s.wgrad == 'whole', name
        assert s.wgrad in ('whole', 'rows')
        assert len(s.fwd) == 2 and len(s.bwd) == 2 and s.taps >= 0


def test_doc_lists_every_code_with_its_kernel():
    rows = re.findall(r'^\| (\d+) \| ([A-Z0-9_]+) \| (op_\w+) \|$', _doc(), re.M)
    assert {name: (int(code), mod) for code, name, mod in rows} == \
        {name: (s.code, s.kernel) for name, s in SPECS.items()}


def test_doc_slot_and_flag_names_are_the_device_constants():
    named = re.findall(r'`([A-Z][A-Z0-9_]*)`=(\d+)', _doc())
    assert named
    for name, value in named:
        assert getattr(opc, name) == int(value), name
    # every option slot, activation code and flag of opc is documented
    consts = {k for k, v in vars(opc).items() if k.isupper() and isinstance(v, int)}
    codes = {s.name for s in SPECS.values()}
    assert consts - codes == {n for n, _ in named}
    # every op with options is in the options table
    table = _doc().split('Option slots')[1].split('### Backward entry')[0]
    for name in codes:
        assert name in table or name in ('RELU', 'RELU6', 'RELU_N1_TO_1', 'TANH', 'LOGISTIC',
                                          'HARD_SWISH', 'ELU'), name


CONST = re.compile(r'^_(\w+) = const\((-?\d+)\)(?:\s+# opc\.(\w+))?$', re.M)


@pytest.mark.parametrize('path', sorted(f for f in os.listdir(MICRO) if f.endswith('.py')))
def test_device_copies_of_the_contract_are_opc_values(path):
    """A board never imports opc (its public names would cost heap): device modules
    carry the values as private consts, each named after its opc constant (or marked
    '# opc.NAME'), and those must be opc's."""
    with open(os.path.join(MICRO, path)) as f:
        src = f.read()
    for name, value, src_name in CONST.findall(src):
        want = src_name or name
        if hasattr(opc, want):
            assert getattr(opc, want) == int(value), f'{path}: _{name} = {value}, opc.{want} = {getattr(opc, want)}'
        else:
            assert not src_name, f'{path}: opc has no {src_name}'
    if path.startswith('op_') or path == 'flat.py':
        assert not re.search(r'^\s*(from utrain\.opc import|import utrain\.opc|from utrain import .*\bopc\b)',
                             src, re.M), path


# a module reads op options or opcodes when it unpacks an op (code, ins, outs, options)
# or reads an op's code or options by the op tuple's slot
READS_OPS = re.compile(r'\b\w+, \w+, \w+, \w+ = op\b|\bops?\[[^\]]*\]\[[03]\]|\bop\[[03]\]')


def _reads_ops(path):
    with open(os.path.join(MICRO, path)) as f:
        return path.startswith('op_') or bool(READS_OPS.search(f.read()))


OP_READERS = sorted(f for f in os.listdir(MICRO) if f.endswith('.py') and f != 'opc.py'
                    and _reads_ops(f))


def test_op_readers_are_found():
    # the modules outside op_*.py that read options or opcodes (convrows: the streamed
    # conv steps; fisher: the board's selection) are among those checked below
    assert {'convrows.py', 'fisher.py', 'op_conv.py', 'op_fc.py'} <= set(OP_READERS)


@pytest.mark.parametrize('path', OP_READERS)
def test_kernels_read_no_positional_options_or_bare_opcodes(path):
    with open(os.path.join(MICRO, path)) as f:
        src = f.read()
    code = '\n'.join(line.split('#')[0] for line in src.splitlines() if not CONST.match(line))
    assert not re.findall(r'\b(?:o|opts|p)\[\d+\s*[\]+\-*]', code), path
    assert not re.findall(r'\bcode [!=]= \d', code), path
    assert not re.findall(r'\b\d+ << ', code), path
    assert not re.findall(r'\bflags & \d', code), path
    assert not re.findall(r'\bfl &= ~?\(?\d', code), path
    assert not re.findall(r'^\w+ = \(\d+(?:, \d+)+\)', code, re.M), path    # opcode tuples


def test_device_opcode_table_uses_the_names():
    with open(os.path.join(MICRO, 'flat.py')) as f:
        src = f.read()
    table = src[src.index('KERNELS = {'):]
    table = table[:table.index('}')]
    assert not re.findall(r'\b\d+:', table)
    assert len(re.findall(r"_[A-Z0-9_]+: 'op_\w+'", table)) == len(SPECS)


def test_the_planner_reads_rows_never_op_names():
    # host_tools/plan/memory.py prices an op by its OpSpec row (temporaries, wgrad, held
    # buffers, kernel module, stream rows): a new op needs no planner edit
    with open(os.path.join(ROOT, 'host_tools', 'plan', 'memory.py')) as f:
        src = f.read()
    named = sorted(n for n in SPECS if re.search(r"['\"]%s['\"]" % n, src))
    assert not named, named
    assert not re.search(r"\.name\s*(==|!=|in\s*[(\[{])", src)   # "in SPECS" is fine


Q8_COPY = re.compile(r'^_(\w+) = (-?\d+)\s+# q8\.(\w+)$', re.M)


def test_one_int8_kind_table():
    """utrain.q8's layer kinds (q8.json's 'k') are the one table: the host's (quant) are
    read from it, the int8 modules q8 imports (and so cannot import it back) carry private
    copies marked '# q8.NAME' that must be q8's, and no int8 module compares a kind with
    a bare number."""
    from host_tools.prepare import quant
    from host_tools.target.device import module
    q8 = module('q8')
    assert {quant.FC, quant.CONV, quant.DW, quant.MEAN, quant.ADD, quant.POOL_MAX,
            quant.POOL_AVG} == {q8.FC, q8.CONV, q8.DW, q8.MEAN, q8.ADD, q8.PMAX, q8.PAVG}
    assert quant.KINDS['ADD'] == q8.ADD and quant.KINDS['MAX_POOL_2D'] == q8.PMAX
    copies = 0
    for path in sorted(f for f in os.listdir(MICRO) if f.startswith('q8') and f.endswith('.py')):
        with open(os.path.join(MICRO, path)) as f:
            src = f.read()
        for name, value, src_name in Q8_COPY.findall(src):
            assert getattr(q8, src_name) == int(value), f'{path}: _{name} = {value}, q8.{src_name} = {getattr(q8, src_name)}'
            copies += 1
        code = '\n'.join(line.split('#')[0] for line in src.splitlines())
        assert not re.findall(r"(?:\bk|\.k|\['k'\]) *(?:[=!<>]=|[<>]) *\d", code), \
            f'{path}: compares a layer kind with a number; use q8\'s names'
    assert copies >= 3
