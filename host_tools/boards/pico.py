"""The emulated Raspberry Pi Pico: the real MicroPython rp2 firmware a user flashes, run
cycle by cycle in the RP2040 emulator rp2040js, with its USB serial on this process's
pipes (or on a pseudo-terminal, as a board for `deploy`, `pull` and `mpremote`).

The firmware is built from MicroPython's sources in a scratch folder, never in this
repository (../shared/board-sim.md); its path comes from $UTRAIN_PICO_FIRMWARE (stock
firmware) or $UTRAIN_PICO_ULAB_FIRMWARE (with ulab), the RP2040 bootrom from
$UTRAIN_PICO_BOOTROM or `bootrom-b1.bin` beside the firmware.  rp2040js comes from npm:
installed on first use into a cache folder ($UTRAIN_CACHE, else ~/.cache/utrain).

The board's file system is littlefs in flash, as on a Pico (352 blocks of 4 KiB at
0xA0000): `flash_files` writes files into a flash image on the host, so a run starts with
its folder already on the board instead of copying it over the emulated USB (minutes).
Time the board prints is RP2040 time: its clock follows the emulated cycles at 125 MHz."""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER_DIR = os.path.join(HERE, 'pico')
RUNNER = os.path.join(RUNNER_DIR, 'run-pico.mjs')
MHZ = 125                       # RPI_PICO's clock: cycles = microseconds x 125
FLASH_SIZE = 2 * 1024 * 1024    # a Pico's W25Q16
FS_OFFSET = 0xA0000             # RPI_PICO: the file system is the last 1408 KiB
BLOCK, BLOCKS, PROG = 4096, 352, 256     # ports/rp2/_boot.py: VfsLfs2(bdev, progsize=256)
# sys.implementation._mpy of MicroPython v1.28's rp2 port: arch armv6m (4), .mpy 6.3
MPY = (4 << 10) | (3 << 8) | 6
ENV = {False: 'UTRAIN_PICO_FIRMWARE', True: 'UTRAIN_PICO_ULAB_FIRMWARE'}


class PicoError(RuntimeError):
    pass


def firmware(ulab=False) -> str:
    """The firmware image (.uf2) to emulate; PicoError saying how to get one."""
    var = ENV[bool(ulab)]
    path = os.environ.get(var)
    if not path:
        raise PicoError(f'no emulated Pico: set ${var} to a MicroPython rp2 firmware '
                        f'(RPI_PICO{" with ulab" if ulab else ""}, .uf2) built as '
                        '../shared/board-sim.md says')
    if not os.path.isfile(path):    # (a device or folder had been 'no such file' too, and
        # neither said what to do)
        raise PicoError(f'${var}={path}: ' + ('a folder' if os.path.isdir(path) else 'not a file'
                                              if os.path.exists(path) else 'no such file')
                        + f': set ${var} to a MicroPython rp2 firmware file (RPI_PICO'
                        f'{" with ulab" if ulab else ""}, .uf2), or unset it')
    return path


def available(ulab=False) -> bool:
    try:
        firmware(ulab)
        bootrom(firmware(ulab))
        return shutil.which('node') is not None
    except PicoError:
        return False


def bootrom(fw) -> str:
    path = os.environ.get('UTRAIN_PICO_BOOTROM') or os.path.join(os.path.dirname(fw),
                                                                'bootrom-b1.bin')
    if not os.path.isfile(path):
        raise PicoError(f'{path}: no RP2040 bootrom here; set $UTRAIN_PICO_BOOTROM to the '
                        '16 KiB B1 bootrom (../shared/board-sim.md)')
    return path


def emulator() -> str:
    """The rp2040js package folder, installed from npm on first use."""
    if os.environ.get('RP2040JS'):
        return os.environ['RP2040JS']
    cache = os.path.join(os.environ.get('UTRAIN_CACHE') or
                         os.path.join(os.path.expanduser('~'), '.cache', 'utrain'), 'pico-emu')
    pkg = os.path.join(cache, 'node_modules', 'rp2040js')
    with open(os.path.join(RUNNER_DIR, 'package.json')) as f:
        want = json.load(f)['dependencies']['rp2040js']
    try:
        with open(os.path.join(pkg, 'package.json')) as f:
            if json.load(f)['version'] == want:
                return pkg
    except (OSError, ValueError, KeyError):
        pass
    if not shutil.which('npm'):
        raise PicoError('the emulated Pico needs node and npm (node >= 18)')
    os.makedirs(cache, exist_ok=True)
    shutil.copy(os.path.join(RUNNER_DIR, 'package.json'), cache)
    p = subprocess.run(['npm', 'install', '--no-audit', '--no-fund'], cwd=cache,
                       capture_output=True, text=True)
    if p.returncode or not os.path.isdir(pkg):
        raise PicoError(f'npm install rp2040js@{want} failed in {cache}: '
                        + (p.stderr or p.stdout).strip()[-300:])
    return pkg


# ---- the file system, on the host

def _lfs(buf, mount=True):
    import littlefs
    ctx = littlefs.context.UserContext(buffer=buf)
    return littlefs.LittleFS(context=ctx, block_size=BLOCK, block_count=BLOCKS, read_size=32,
                             prog_size=PROG, lookahead_size=32, mount=mount)


def _fs_region(flash):
    if os.path.exists(flash):
        with open(flash, 'rb') as f:
            f.seek(FS_OFFSET)
            buf = bytearray(f.read(BLOCK * BLOCKS))
        if len(buf) == BLOCK * BLOCKS:
            return buf
    return None


def flash_files(flash, files, fresh=False):
    """Write files ({board path: host path or bytes}) into the littlefs of the flash image
    at flash (made, formatted, when absent or fresh); folders are made as needed."""
    buf = None if fresh else _fs_region(flash)
    if buf is None:
        buf = bytearray(b'\xff' * (BLOCK * BLOCKS))
        fs = _lfs(buf, mount=False)
        fs.format()
        fs.mount()
    else:
        fs = _lfs(buf)
    total = 0
    for name, src in files.items():
        data = src if isinstance(src, (bytes, bytearray)) else open(src, 'rb').read()
        total += len(data)
        d = os.path.dirname(name)
        if d:
            fs.makedirs(d, exist_ok=True)
        try:
            with fs.open(name, 'wb') as f:
                f.write(data)
        except Exception as e:          # littlefs' LittleFSError: no space
            raise PicoError(f'{name}: does not fit the Pico\'s 1408 KiB file system with '
                            f'the rest ({total} bytes so far): {e}') from None
    fs.unmount()
    if not os.path.exists(flash):
        with open(flash, 'wb') as f:
            f.write(b'\xff' * FLASH_SIZE)
    with open(flash, 'r+b') as f:
        f.seek(FS_OFFSET)
        f.write(buf)


def read_files(flash, names=None):
    """{board path: bytes} of the top-level files (or of names) in the flash image."""
    buf = _fs_region(flash)
    if buf is None:
        return {}
    fs = _lfs(buf)
    out = {}
    for n in (names if names is not None else fs.listdir('/')):
        try:
            if fs.stat(n).type != 1:        # LFS_TYPE_REG
                continue
            with fs.open(n, 'rb') as f:
                out[n] = f.read()
        except Exception:
            continue
    return out


# ---- the board

class Pico:
    """One emulated Pico; its serial line is this object's pipes.  flash: the 2 MiB flash
    image file (kept: the file system survives the board).  log/stats: the runner's
    diagnostics and its cycle counter (JSON, rewritten every second and at exit)."""

    def __init__(self, flash, ulab=False, fw=None, log=None, stats=None):
        fw = fw or firmware(ulab)
        self.flash = flash
        work = os.path.dirname(os.path.abspath(flash))
        self.log = log or os.path.join(work, 'pico.log')
        self.stats_file = stats or os.path.join(work, 'pico-stats.json')
        env = dict(os.environ, RP2040JS=emulator())
        self.proc = subprocess.Popen(
            ['node', RUNNER, '--image', fw, '--bootrom', bootrom(fw), '--flash', flash,
             '--stats', self.stats_file, '--log', self.log],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(self.log, 'ab'),
            env=env, start_new_session=True)
        self._buf = b''
        self._lock = threading.Lock()

    # serial line
    def write(self, data):
        with self._lock:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()

    def _read(self, timeout):
        fd = self.proc.stdout.fileno()
        r, _, _ = select.select([fd], [], [], timeout)
        if not r:
            return None
        data = os.read(fd, 4096)
        if not data:
            raise PicoError('the emulated Pico stopped: ' + self._last_log())
        return data

    def _last_log(self):
        try:
            with open(self.log) as f:
                return f.read().strip()[-300:]
        except OSError:
            return '(no log)'

    def read_until(self, marker, timeout=120, echo=None):
        """Bytes up to and including marker; echo(bytes) sees them as they come."""
        end = time.time() + timeout
        while marker not in self._buf:
            left = end - time.time()
            if left <= 0:
                raise PicoError(f'the emulated Pico did not answer in {timeout:g} s '
                                f'(waiting for {marker!r}; last output {self._buf[-80:]!r})')
            data = self._read(min(left, 0.5))
            if data:
                if echo:
                    echo(data)
                self._buf += data
        i = self._buf.index(marker) + len(marker)
        out, self._buf = self._buf[:i], self._buf[i:]
        return out

    def raw_repl(self, timeout=120):
        """Interrupt whatever runs and enter the raw REPL (as mpremote does)."""
        end = time.time() + timeout
        while True:
            self.write(b'\r\x03\x03\x01')
            try:
                self.read_until(b'raw REPL; CTRL-B to exit\r\n>', timeout=5)
                self._buf = b''
                return
            except PicoError:
                if time.time() > end or self.proc.poll() is not None:
                    raise PicoError('the emulated Pico gave no REPL: ' + self._last_log())

    def exec(self, code, echo=None, timeout=None, on_interrupt=None):
        """Run code in the raw REPL; (stdout, exception text).  A KeyboardInterrupt here
        sends the board a Ctrl-C byte, as a terminal does (on_interrupt() is called)."""
        self.write(code.encode() + b'\x04')
        self.read_until(b'OK', timeout=30)
        end = time.time() + (timeout or 1e9)
        out = b''
        while True:
            try:
                out += self.read_until(b'\x04', timeout=max(1, end - time.time()), echo=echo)
                break
            except KeyboardInterrupt:
                self.write(b'\x03')
                if on_interrupt:
                    on_interrupt()
        err = self.read_until(b'\x04', timeout=30)
        # then '>' (the raw REPL's prompt), after a soft reboot's banner when the code
        # raised SystemExit (train.py does when training failed)
        self.read_until(b'>', timeout=60)
        return out[:-1].decode(errors='replace'), err[:-1].decode(errors='replace')

    def cycles(self):
        """Core 0's cycle count (the runner's counter, refreshed when asked)."""
        self.proc.send_signal(signal.SIGUSR1)
        time.sleep(0.2)
        try:
            with open(self.stats_file) as f:
                return json.load(f)['cycles']
        except (OSError, ValueError, KeyError):
            return None

    def close(self):
        """Stop the board; the runner saves the flash image first."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def ballast(free):
    """Code that leaves about `free` bytes of the board's heap free (a bytearray holding
    the rest, allocated before anything else): the smallest heap that trains, measured
    on the chip without rebuilding the firmware."""
    if not free:
        return ''
    from ..target.runner import size_bytes
    return ('import gc\ngc.collect()\n_b=gc.mem_free()-%d\n_b=bytearray(_b) if _b>0 else None\n'
            'gc.collect()\nprint("utrain: pico: free heap %%d B" %% gc.mem_free())\n'
            % size_bytes(str(free)))


END = 'utrain: end: '


def _folder_files(d):
    """The run folder as the board's root holds it: its top-level files (not hidden ones)
    and lib/utrain, staged as .mpy for the rp2 port."""
    from ..target import runner
    lib = runner.stage(d, mpy=MPY)
    files = {n: os.path.join(d, n) for n in sorted(os.listdir(d))
             if not n.startswith('.') and os.path.isfile(os.path.join(d, n))}
    for n in sorted(os.listdir(lib)):
        files['lib/utrain/' + n] = os.path.join(lib, n)
    return files


def run_folder(d, ulab=False, heap=None, stream=True, timeout=None, script='train.py'):
    """`run DIR --emulate`: boot the emulated Pico with folder d already on its flash, run
    train.py (or script) there, after a heap ballast leaving `heap` bytes free when given,
    and copy back what the board wrote.  Returns (exit code, output): 0 when the board's
    last line says `utrain: end: ok` (for another script: when it raised nothing).  A
    Ctrl-C here reaches the board as the Ctrl-C byte."""
    if not os.path.exists(os.path.join(d, 'train.json')):
        raise FileNotFoundError(f'{d}: no train.json here; run `prepare` first')
    work = os.path.join(d, '.pico')
    os.makedirs(work, exist_ok=True)
    flash = os.path.join(work, 'flash.bin')
    files = _folder_files(d)
    flash_files(flash, files, fresh=True)
    echo = (lambda b: print(b.decode(errors='replace').replace('\r\n', '\n'), end='',
                            flush=True)) if stream else None
    with open(os.path.join(d, script)) as f:
        code = ballast(heap) + f.read()
    with Pico(flash, ulab=ulab) as board:
        board.raw_repl()
        out, err = board.exec(code, echo=echo, timeout=timeout)
    if err and stream:
        print(err, end='' if err.endswith('\n') else '\n')
    for name, data in read_files(flash).items():
        path = os.path.join(d, name)
        old = None
        if os.path.exists(path):
            with open(path, 'rb') as f:
                old = f.read()
        if old != data:
            with open(path, 'wb') as f:
                f.write(data)
    text = (out + err).replace('\r\n', '\n')
    if script != 'train.py':
        return (1 if err.strip() else 0), text
    ends = [x[len(END):].strip() for x in text.splitlines() if x.startswith(END)]
    return (0 if ends and ends[-1] == 'ok' else 1), text


def gc_total(ulab=False):
    """(GC heap in all, free after boot) of the firmware, asked once per firmware."""
    fw = firmware(ulab)
    if fw not in _TOTAL:
        with tempfile.TemporaryDirectory() as t:
            flash = os.path.join(t, 'flash.bin')
            flash_files(flash, {})
            with Pico(flash, ulab=ulab) as b:
                b.raw_repl()
                out, _ = b.exec('import gc\ngc.collect()\nprint(gc.mem_alloc()+gc.mem_free(), '
                                'gc.mem_free())')
        _TOTAL[fw] = tuple(int(v) for v in out.split()[-2:])
    return _TOTAL[fw]


_TOTAL = {}


def smallest_heap(d, ulab=False, lo=16 * 1024, hi=None, step=1024):
    """The smallest GC heap (bytes, within step) in which folder d trains on the emulated
    Pico, or None: a ballast leaves free = heap - (what the firmware holds after boot),
    so the figure compares with a unix build's -X heapsize and with the planner's."""
    total, free = gc_total(ulab)
    held = total - free
    from ..plan.memory import bisect_heap, first_run

    def trains(heap):       # (each run a first run: run_folder copies back what it wrote)
        first_run(d)
        return run_folder(d, ulab, heap=heap - held, stream=False)[0] == 0
    return bisect_heap(trains, lo, hi or total, step)


class PicoBoard(Pico):
    """An emulated Pico behind a pseudo-terminal: `port` is a serial port for mpremote,
    `deploy`, `pull` and `fleet`, as a USB-attached Pico's /dev/ttyACM0 is.  Bytes pass
    through unchanged (a Ctrl-C is the firmware's to handle, as over USB).  flash: the
    flash image (a deployed board survives in it: copy it to clone the board); files:
    {board path: host path or bytes} written into its file system before boot."""

    def __init__(self, flash, ulab=False, files=None, fw=None, boot_timeout=120):
        import pty
        import tty
        if files is not None or not os.path.exists(flash):
            flash_files(flash, files or {}, fresh=not os.path.exists(flash))
        super().__init__(flash, ulab=ulab, fw=fw)
        # wait for the REPL before anyone connects: a first boot takes seconds of wall time
        end = time.time() + boot_timeout
        while True:
            self.write(b'\r\x03')
            try:
                self.read_until(b'>>> ', timeout=3)
                break
            except PicoError:
                if time.time() > end or self.proc.poll() is not None:
                    self.close()
                    raise PicoError('the emulated Pico gave no REPL: ' + self._last_log())
        time.sleep(0.2)
        while self._read(0.2):
            pass
        self._buf = b''
        self._m, s = pty.openpty()
        tty.setraw(s)
        self.port = os.ttyname(s)
        self._s = s                 # kept open: the relay never sees the port close
        self._stop = False
        self._t = threading.Thread(target=self._relay, daemon=True)
        self._t.start()

    def _relay(self):
        out = self.proc.stdout.fileno()
        while not self._stop:
            try:
                r, _, _ = select.select([self._m, out], [], [], 0.1)
            except (OSError, ValueError):
                return
            for fd in r:
                try:
                    data = os.read(fd, 4096)
                except OSError:
                    data = b''
                if not data:
                    if fd == out:
                        return          # the emulator stopped
                    continue
                try:
                    if fd == out:
                        os.write(self._m, data)
                    else:
                        self.write(data)
                except OSError:
                    return

    def close(self):
        self._stop = True
        if getattr(self, '_t', None):
            self._t.join(2)
        super().close()
        for fd in (getattr(self, '_m', None), getattr(self, '_s', None)):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._m = self._s = None
