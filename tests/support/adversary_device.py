# Driver of tests/robustness/test_hostile_inputs.py's board cases; runs unchanged under unix
# MicroPython and CPython, every case of a run in this one process:
#   adversary_device.py ROOT CASE...
# For each case folder ROOT/CASE: chdir into it, run utrain.run.start('train.json') as
# train.py does, and print '@@CASE name', what train.py printed, then '@@END name
# code' (the SystemExit code, 0 when it returned) or '@@TRACEBACK type message' for
# anything else that escaped.  A case.json in the folder may say
# {"fail_write": "NAME"}: opening NAME (or NAME.tmp) for writing raises OSError 28,
# the file system is full.
import sys
import os
import json
import builtins

root = sys.argv[1]
real_open = open
import utrain.run as run  # noqa: E402


def full(name):
    def fopen(p, mode='r', *a):
        if ('w' in mode or 'a' in mode or '+' in mode) and (p == name or p == name + '.tmp'):
            raise OSError(28)
        return real_open(p, mode, *a)
    return fopen


for name in sys.argv[2:]:
    os.chdir(root + '/' + name)
    spec = {}
    try:
        with real_open('case.json') as f:
            spec = json.load(f)
    except OSError:
        pass
    if spec.get('fail_write'):
        builtins.open = full(spec['fail_write'])
    print('@@CASE', name)
    code = 0
    try:
        run.STATE.clear()
        run.start('train.json')
    except SystemExit as e:
        code = e.args[0] if e.args else 0
    except BaseException as e:  # noqa: B902 - what the suite counts as a traceback
        print('@@TRACEBACK', type(e).__name__, e)
        code = 99
    builtins.open = real_open
    print('@@END', name, code)
